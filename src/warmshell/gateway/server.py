"""Wiring of one gateway: store, driver, registry, services, HTTP, reconcilers; start and a
graceful stop. `serve()` runs it until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import grpc

from warmshell.api.v1 import sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core import lifetimes
from warmshell.core.config import GatewayConfig
from warmshell.core.deadlines import ProvisioningDeadlines
from warmshell.core.errors import FailedPreconditionError, UnavailableError, WarmshellError
from warmshell.core.ids import SandboxId
from warmshell.drivers import keyfiles
from warmshell.drivers.base import ComputeDriver, Leadership
from warmshell.gateway import collector, listening, statedir
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.drivers import build_driver
from warmshell.gateway.egress import interception
from warmshell.gateway.egress.gate import EgressGate, HostsEgressSockets
from warmshell.gateway.egress.proxy import EgressProxy
from warmshell.gateway.events import Changed, EventBus
from warmshell.gateway.execs import ExecRelay
from warmshell.gateway.expiry import ExpiryReconciler
from warmshell.gateway.file_service import FileService
from warmshell.gateway.forwarding import Forwarder
from warmshell.gateway.http import start_http
from warmshell.gateway.inprocess import HostsSupervisors, InProcessLink
from warmshell.gateway.logs import configure_logging
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.progressfeed import ProgressFeed
from warmshell.gateway.ratelimits import RateLimiter
from warmshell.gateway.reconciler import Reconciler
from warmshell.gateway.records import KIND_SANDBOX, SandboxRecords
from warmshell.gateway.registry import Registry
from warmshell.gateway.replicas import ReplicaDirectory
from warmshell.gateway.sandbox_service import SandboxService
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.sessions import MISSED_HEARTBEATS, SessionTable
from warmshell.gateway.store import opening
from warmshell.gateway.store.base import Store
from warmshell.gateway.store.postgres import Change, PostgresStore, StartupProgress
from warmshell.gateway.store.sqlite import SqliteStore
from warmshell.gateway.supervisor_service import SupervisorService
from warmshell.gateway.tokens import (
    SandboxTokenIssuer,
    load_or_create_api_token,
    load_or_create_signing_key,
)

__all__ = ["Gateway", "serve"]

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0


def _socket_in_use(path: Path) -> bool:
    """Whether something is accepting connections on a Unix socket path."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _gateway_id(state_dir: Path) -> str:
    """A stable id for this gateway's state (part of the sandbox-token audience)."""
    path = state_dir / "gateway-id"
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_hex(8)
    path.write_text(value + "\n")
    return value


def _replica_id(configured: str) -> str:
    # In a pod the hostname is the pod's name: unique among replicas, stable for its life.
    return configured or f"{socket.gethostname()}-{os.getpid()}"


async def _reachable_address(listen: str, port: int) -> str:
    """Where other replicas reach this one: the listening host, or for a wildcard listener (a
    pod's 0.0.0.0) the address the hostname resolves to (the pod IP, from /etc/hosts)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = await asyncio.to_thread(socket.gethostbyname, socket.gethostname())
    return f"{host}:{port}"


def _follow(bus: EventBus) -> Callable[[Change], None]:
    """Another replica's write, told to this replica's watchers."""

    def changed(change: Change) -> None:
        if not change.kind:
            bus.changed_everywhere()
        elif change.kind == KIND_SANDBOX:
            if change.op == "DELETE":
                bus.forget(SandboxId(change.id))
            else:
                bus.publish(SandboxId(change.id), Changed())

    return changed


class Gateway:
    """One running gateway. `await start()`, then `await stop()`.

    With a Postgres store it is one of several replicas: it announces itself in the store, hears
    the others' writes (LISTEN/NOTIFY), forwards calls needing a session another replica holds,
    and runs the singleton work only while it holds the driver's Lease."""

    def __init__(self, config: GatewayConfig, driver: ComputeDriver | None = None) -> None:
        self.config = config
        self.paths = config.paths
        self._given_driver = driver
        self._driver: ComputeDriver | None = None  # set once entered, so stop() exits only what started
        self._tasks: list[asyncio.Task[None]] = []
        self._servers: list[grpc.aio.Server] = []
        self._http: object | None = None
        self._store: Store | None = None
        self._directory: ReplicaDirectory | None = None
        self._forwarder: Forwarder | None = None
        self._supervisor_link: InProcessLink | None = None
        self._egress: EgressGate | None = None
        self._opening = StartupProgress()  # what /healthz says while start-up waits for the store
        self._draining = False
        self._stopping = False
        self._bound = False  # only a gateway that bound the sockets may remove them
        self.http_port = 0
        self.tcp_port = 0

    @property
    def driver(self) -> ComputeDriver:
        """The compute driver in use."""
        assert self._driver is not None
        return self._driver

    async def start(self) -> None:
        """Serve /healthz (NotServing until started), open the store (waiting for an unreachable
        Postgres as `store.startup_timeout_seconds` says), start the driver and listen; returns
        once serving. A start that fails half-way, or is cancelled (SIGTERM while it waits),
        releases what it had opened (HTTP, store, driver, sockets) before raising."""
        self._stopping = False
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        paths = self.paths
        statedir.ensure_state_dir(paths.root, private_volume=self.config.state_dir_private_volume)
        if _socket_in_use(paths.socket):
            raise FailedPreconditionError(
                f"another gateway is already serving {paths.socket}: stop it, or give this one its own --state-dir"
            )
        with statedir.private_umask():
            api_token = load_or_create_api_token(paths.api_token)
            gateway_id = _gateway_id(paths.root)
            issuer = SandboxTokenIssuer(
                load_or_create_signing_key(paths.signing_key),
                gateway_id=gateway_id,
                ttl_seconds=self.config.sandbox_token_ttl_seconds,
            )
            secrets_key = keyfiles.load_or_create_key(
                Path(self.config.secrets_key_file) if self.config.secrets_key_file else paths.secrets_key
            )
        # Health first: a probe learns why this gateway is not serving yet (a database it waits for).
        self._http, self.http_port = await start_http(self.config.http_host, self.config.http_port, self._healthy)
        with statedir.private_umask():
            self._store = await opening.open_store(
                self.config.store, default_sqlite=paths.database, progress=self._opening
            )
            # A shared store means replicas: they share this token (a Secret on Kubernetes).
            shared = isinstance(self._store, PostgresStore)
            replica_token = (
                load_or_create_api_token(
                    Path(self.config.replicas.token_file) if self.config.replicas.token_file else paths.replica_token
                )
                if shared
                else ""
            )
        replica_id = _replica_id(self.config.replicas.id)
        driver = (
            self._given_driver if self._given_driver is not None else build_driver(self.config, gateway_id=gateway_id)
        )
        await driver.__aenter__()
        self._driver = driver
        bus = EventBus()
        sessions = SessionTable(
            window_ms=int(MISSED_HEARTBEATS * self.config.heartbeat_interval_seconds * 1000),
            owner=replica_id if shared else "",
        )
        # A SQLite file has one gateway (replicas need Postgres), so its records may be cached.
        records = SandboxRecords(self._store, bus, exclusive=isinstance(self._store, SqliteStore))
        registry: Registry[spb.SupervisorActivationMessage] = Registry()
        self.registry = registry
        self.issuer = issuer
        vault = SecretVault(self._store, secrets_key)
        sockets = driver if isinstance(driver, HostsEgressSockets) else None
        self._egress = await _egress_gate(self.config, sockets, driver)
        records.observe(self._egress.observe)
        activator = GatewayActivator(registry, records, issuer, vault, self._egress)
        self.activator = activator
        lifetime_config = self.config.lifetimes
        self.manager = manager = SandboxManager(
            records=records,
            driver=self._driver,
            bus=bus,
            sessions=sessions,
            vault=vault,
            deadlines=ProvisioningDeadlines(
                cold_seconds=self.config.provisioning_deadline_seconds,
                warm_seconds=self.config.warm_activation_deadline_seconds,
            ),
            limits=lifetimes.Limits(
                default_ttl_seconds=lifetime_config.default_ttl_seconds,
                max_ttl_seconds=lifetime_config.max_ttl_seconds,
                default_idle_timeout_seconds=lifetime_config.default_idle_timeout_seconds,
                max_idle_timeout_seconds=lifetime_config.max_idle_timeout_seconds,
            ),
        )
        auth = Authenticator(
            api_token=api_token, issuer=issuer, identity=self._driver.identity, replica_token=replica_token
        )
        leadership = self._driver if shared and isinstance(self._driver, Leadership) else None

        def leading() -> bool:
            return leadership is None or leadership.leading()

        feed = (
            ProgressFeed(replica_id, bus, self._store.notify_progress)
            if isinstance(self._store, PostgresStore)
            else None
        )
        reconciler = Reconciler(
            manager,
            interval_seconds=self.config.reconcile_interval_seconds,
            orphan_grace_seconds=self.config.orphan_grace_seconds,
            leading=leading,
            share_progress=feed.share if feed is not None else None,
        )
        live_owners: frozenset[str] = frozenset()
        if shared:
            self._directory = ReplicaDirectory(
                self._store,
                replica_id=replica_id,
                address=self.config.replicas.address,
                heartbeat_seconds=self.config.replicas.heartbeat_seconds,
            )
            await self._directory.refresh()
            live_owners = frozenset(self._directory.alive_ids() - {replica_id})
            self._forwarder = Forwarder(self._directory, auth, token=replica_token)
        await reconciler.startup(live_owners=live_owners)

        def new_server() -> grpc.aio.Server:
            return listening.new_server(
                max_connections=self.config.max_connections,
                max_receive_bytes=self.config.max_request_bytes,
                handshake_timeout_seconds=self.config.handshake_timeout_seconds,
                connection_idle_seconds=self.config.connection_idle_seconds,
                max_connection_age_seconds=self.config.replicas.drain_seconds / 2 if shared else 0,
            )

        limits = self.config.rate_limits
        delay = limits.refusal_delay_seconds
        supervisor_service = SupervisorService(
            manager=manager,
            identity=self._driver.identity,
            registry=registry,
            activator=activator,
            issuer=issuer,
            auth=auth,
            heartbeat_interval_seconds=self.config.heartbeat_interval_seconds,
            registrations=RateLimiter("registration", limits.registration, refusal_delay_seconds=delay),
            token_refreshes=RateLimiter("token_refresh", limits.token_refresh, refusal_delay_seconds=delay),
            replicas=self._directory,
        )
        if isinstance(driver, HostsSupervisors):  # its supervisors run here: no socket between us
            self._supervisor_link = InProcessLink(supervisor_service)
            driver.supervise_in_process(self._supervisor_link)
        # The public socket and TCP serve both APIs (supervisors in pods come in over TCP);
        # supervisor.sock serves the supervisor API alone.
        public, supervisors = new_server(), new_server()
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(
            SandboxService(
                manager,
                auth,
                ExecRelay(
                    window_bytes=self.config.exec_output_window_bytes,
                    stall_seconds=self.config.exec_stall_timeout_seconds,
                ),
                self._forwarder,
                egress=self._egress,
            ),
            public,
        )
        sandbox_pb2_grpc.add_FileServiceServicer_to_server(
            FileService(manager, auth, self.config.files, self._forwarder), public
        )
        for server in (public, supervisors):
            supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(supervisor_service, server)
        self._bound = True
        with statedir.private_umask():  # the sockets are private from the moment they exist
            for path, server in ((paths.socket, public), (paths.supervisor_socket, supervisors)):
                path.unlink(missing_ok=True)
                server.add_insecure_port(f"unix://{path}")
            if self.config.listen_tcp:
                self.tcp_port = public.add_insecure_port(self.config.listen_tcp)
            for server in (public, supervisors):
                await server.start()
        os.chmod(paths.socket, 0o600)
        os.chmod(paths.supervisor_socket, 0o600)
        self._servers = [public, supervisors]
        if self._directory is not None:
            if not self._directory.address and self.tcp_port:
                self._directory.address = await _reachable_address(self.config.listen_tcp, self.tcp_port)
            await self._directory.announce()

        if feed is not None and isinstance(self._store, PostgresStore):
            # Listening before serving: another replica's progress lines said before then would
            # never reach this replica's watchers (record changes are re-read on a watch anyway).
            heard_from = asyncio.Event()
            feeds = self._store.follow_changes(_follow(bus), feed.heard, heard_from)
            self._tasks = [
                asyncio.create_task(feeds, name="store-changes"),
                asyncio.create_task(feed.run(), name="progress-feed"),
            ]
            with contextlib.suppress(TimeoutError):  # the feed retries on its own; do not hang the start
                await asyncio.wait_for(heard_from.wait(), self.config.store.connect_timeout_seconds)
        with statedir.private_umask():
            self._write_runtime_info()
        await self._driver.start(activator)
        if leadership is not None:
            leadership.campaign()
        self._tasks += [
            asyncio.create_task(reconciler.run_watch(), name="driver-watch"),
            asyncio.create_task(reconciler.run_relist(), name="relist"),
            asyncio.create_task(
                ExpiryReconciler(
                    manager, interval_seconds=lifetime_config.check_interval_seconds, leading=leading
                ).run(),
                name="expiry",
            ),
        ]
        if self._directory is not None:
            self._tasks.append(
                asyncio.create_task(self._directory.run(leading=leading, records=records), name="replica-heartbeat")
            )
        log.info(
            "gateway serving on %s (http %s:%d, driver %s)",
            paths.socket,
            self.config.http_host,
            self.http_port,
            self._driver.name,
        )

    async def _healthy(self) -> str | None:
        """/healthz: None while serving, else why not."""
        if self._stopping:
            return "not serving: stopping"
        if self._draining:
            return "not serving: draining before shutdown"
        store = self._store
        if store is None:
            return f"not serving: {self._opening.problem() or 'opening the store'}"
        if not self._servers:
            return "not serving: starting"
        try:
            await store.ping()
        except UnavailableError as exc:
            return f"not serving: {exc}"
        return None

    def _write_runtime_info(self) -> None:
        host = self.config.listen_tcp.rsplit(":", 1)[0] if self.config.listen_tcp else ""
        info = {
            "pid": os.getpid(),
            "socket": str(self.paths.socket),
            "tcp": f"{host}:{self.tcp_port}" if self.tcp_port else "",
            "http": f"{self.config.http_host}:{self.http_port}",
        }
        tmp = self.paths.runtime_info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info) + "\n")
        tmp.replace(self.paths.runtime_info)

    async def drain(self) -> None:
        """Before a stop (SIGTERM), as one of several replicas: keep serving for
        `replicas.drain_seconds` while /healthz says NotServing, so the Service stops sending
        new connections here and the existing ones go away gracefully (their age limit)."""
        if self._directory is None or not self.config.replicas.drain_seconds:
            return
        self._draining = True
        log.info("draining for %gs before stopping", self.config.replicas.drain_seconds)
        await asyncio.sleep(self.config.replicas.drain_seconds)

    async def stop(self) -> None:
        """Graceful stop: stop loops, tell supervisors, drain calls, close driver and store."""
        # A start refused before it opened anything (another gateway serves this state) stops nothing.
        opened = self._store is not None or self._driver is not None or self._bound or self._http is not None
        self._stopping = True
        stopping: list[asyncio.Future[None]] = []
        if self._servers:
            # Refuse new calls first (GOAWAY: clients retry them on another replica), then end
            # the streams: a supervisor told to reconnect, or a watcher told to watch again, must
            # not find this gateway again but another replica (or this one's successor).
            stopping = [asyncio.ensure_future(server.stop(SHUTDOWN_GRACE_SECONDS)) for server in self._servers]
            if self._supervisor_link is not None:
                self._supervisor_link.close()
            await asyncio.sleep(0)
            self.manager.close()
            self.manager.bus.close_all()
            self.manager.sessions.close_all("gateway shutting down")
            self.registry.close_all("gateway shutting down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if stopping:
            await asyncio.gather(*stopping)
            self._servers = []
        if self._egress is not None:  # before the driver: no connection outlives its sandbox
            await self._egress.aclose()
            self._egress = None
        if self._forwarder is not None:
            await self._forwarder.aclose()
            self._forwarder = None
        if self._directory is not None:
            with contextlib.suppress(WarmshellError):
                await self._directory.withdraw()
            self._directory = None
        if self._http is not None:
            await self._http.cleanup()  # type: ignore[attr-defined]
            self._http = None
        if self._driver is not None:
            await self._driver.__aexit__(None, None, None)
            self._driver = None
        if self._supervisor_link is not None:  # its sessions ended with their supervisors, or end here
            await self._supervisor_link.aclose()
            self._supervisor_link = None
        if self._store is not None:
            await self._store.aclose()
            self._store = None
        if self._bound:
            self.paths.runtime_info.unlink(missing_ok=True)
            for path in (self.paths.socket, self.paths.supervisor_socket):
                path.unlink(missing_ok=True)
            self._bound = False
        if opened:
            log.info("gateway stopped")


async def _egress_gate(config: GatewayConfig, sockets: HostsEgressSockets | None, driver: ComputeDriver) -> EgressGate:
    """The egress proxy and its gate; with a driver that binds its sockets into sandboxes, the
    CA that intercepts TLS for placeholder secrets (FailedPreconditionError, one line, when it
    cannot be loaded or made: the gateway does not start)."""
    network = config.network
    authority = None
    if sockets is not None:
        directory = config.paths.root / "egress"
        authority = await asyncio.to_thread(interception.CertificateAuthority, directory)
    upstream = interception.upstream_context(network.upstream_ca_file)
    proxy = EgressProxy(network, authority=authority, upstream_tls=upstream)
    return EgressGate(network, proxy, sockets, pools=driver.pools, authority=authority)


async def serve(config: GatewayConfig) -> None:
    """Run a gateway until SIGTERM or SIGINT, then stop gracefully."""
    configure_logging(config.log_level)
    gateway = Gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A signal while starting (a store still unreachable) ends the start, as gracefully as a stop.
    starting = asyncio.create_task(gateway.start(), name="gateway-start")
    stopped = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("stopping before the gateway started")
            starting.cancel()
            await asyncio.wait((starting,))  # start() releases what it had opened
            if starting.cancelled():
                return
        starting.result()  # a failed start raises here; one that finished anyway is stopped below
    except BaseException:
        stopped.cancel()
        raise
    collector.install(config.gc_young_threshold)
    full = collector.FullCollections(
        gateway.manager.busy, interval=config.gc_full_interval_seconds, overdue=config.gc_full_overdue_seconds
    )
    collecting = asyncio.create_task(full.run(), name="full-collections")
    try:
        await stopped
        await gateway.drain()
    finally:
        collecting.cancel()
        await gateway.stop()
