"""One gateway's life: read its keys, open its store, assemble its parts (`assembly`), then
start them in order on one exit stack, so a stop (or a start that fails half-way) unwinds what
started, last first. `serve()` runs a gateway until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import secrets
import signal
import socket
from dataclasses import replace
from pathlib import Path

import grpc

from warmshell.api.v1 import image_pb2_grpc, sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.core.config import GatewayConfig
from warmshell.core.errors import FailedPreconditionError, UnavailableError
from warmshell.drivers import keyfiles
from warmshell.drivers.base import ComputeDriver
from warmshell.gateway import collector, listening, statedir
from warmshell.gateway.assembly import GatewayParts, Keys, assemble
from warmshell.gateway.capped import CappedProtocols
from warmshell.gateway.drivers import build_driver
from warmshell.gateway.egress import interception
from warmshell.gateway.egress.gate import EgressTrust, HostsEgressSockets
from warmshell.gateway.http import start_http
from warmshell.gateway.logs import configure_logging
from warmshell.gateway.loops import Loops
from warmshell.gateway.store import opening
from warmshell.gateway.store.base import Store
from warmshell.gateway.store.postgres import PostgresStore, StartupProgress
from warmshell.gateway.tokens import load_or_create_api_token, load_or_create_signing_key

__all__ = ["Gateway", "serve"]

log = logging.getLogger(__name__)

_GOING_AWAY = "gateway shutting down"


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


def _read_keys(config: GatewayConfig) -> Keys:
    """The state directory's credentials, created (private) on first start."""
    paths = config.paths
    with statedir.private_umask():
        return Keys(
            api_token=load_or_create_api_token(paths.api_token),
            gateway_id=_gateway_id(paths.root),
            signing_key=load_or_create_signing_key(paths.signing_key),
            secrets_key=keyfiles.load_or_create_key(
                Path(config.secrets_key_file) if config.secrets_key_file else paths.secrets_key
            ),
        )


def _read_replica_token(config: GatewayConfig) -> str:
    """The credential replicas share (a Secret on Kubernetes), created on first start."""
    with statedir.private_umask():
        configured = config.replicas.token_file
        return load_or_create_api_token(Path(configured) if configured else config.paths.replica_token)


def _exec_not_finished() -> UnavailableError:
    return UnavailableError(f"{listening.STOPPING} (the exec did not finish before it stopped)")


class _Phase(enum.Enum):
    """Where a gateway is in its life, as /healthz tells it."""

    IDLE = "idle"  # not started, or stopped
    OPENING = "opening the store"
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining before shutdown"
    STOPPING = "stopping"


class Gateway:
    """One running gateway. `await start()`, then `await stop()`; `parts` once started.

    With a Postgres store it is one of several replicas (`replication`): it announces itself in
    the store, hears the others' writes, forwards calls needing a session another replica holds,
    and runs the singleton work only while it holds the driver's Lease."""

    def __init__(self, config: GatewayConfig, driver: ComputeDriver | None = None) -> None:
        """`driver`: the compute driver to use (entered by the gateway) instead of the configured one."""
        self.config = config
        self.paths = config.paths
        self._loops = Loops()  # the reconcilers' (a replica's own are its `replication.loops`)
        self.http_port = 0
        self.tcp_port = 0
        self.egress_port = 0  # the egress proxy's network listener ([network] proxy_listen), once listening
        # The HTTP port's connections (probes and a scraper), capped: what a flood is held to.
        self.http_connections: CappedProtocols | None = None
        self._given_driver = driver
        self._parts: GatewayParts | None = None
        self._stack = contextlib.AsyncExitStack()
        self._phase = _Phase.IDLE
        self._opening = StartupProgress()  # what /healthz says while start-up waits for the store

    @property
    def parts(self) -> GatewayParts:
        """The gateway's parts (its manager, registry, driver, services...), once assembled."""
        if self._parts is None:
            raise RuntimeError("the gateway has not been started")
        return self._parts

    @property
    def background(self) -> tuple[asyncio.Task[None], ...]:
        """The background loops running (a done one has died): reconcilers, replica heartbeat
        and change feeds."""
        replication = self._parts.replication if self._parts is not None else None
        return self._loops.tasks + (replication.loops.tasks if replication is not None else ())

    async def start(self) -> None:
        """Serve /healthz (NotServing until started), open the store (waiting for an unreachable
        Postgres as `store.startup_timeout_seconds` says), start the driver and listen; returns
        once serving. A start that fails half-way, or is cancelled (SIGTERM while it waits),
        releases what it had opened (HTTP, store, driver, sockets) before raising."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        statedir.ensure_state_dir(self.paths.root, private_volume=self.config.state_dir_private_volume)
        if _socket_in_use(self.paths.socket):
            raise FailedPreconditionError(
                f"another gateway is already serving {self.paths.socket}: stop it, or give this one its own --state-dir"
            )
        keys = _read_keys(self.config)
        self._phase = _Phase.OPENING
        stack = self._stack
        # Health first: a probe learns why this gateway is not serving yet (a database it waits for).
        # It stops last, saying "stopping" until then.
        http, self.http_port = await start_http(
            self.config.http_host, self.config.http_port, self._healthy, before_metrics=self._refresh_usage
        )
        self.http_connections = http.connections
        stack.push_async_callback(http.cleanup)
        store = await self._open_store(stack)
        if isinstance(store, PostgresStore):  # a shared store means replicas: they share a token
            keys = replace(keys, replica_token=_read_replica_token(self.config))
        self._phase = _Phase.STARTING
        driver = self._given_driver
        if driver is None:
            driver = build_driver(self.config, gateway_id=keys.gateway_id)
        stack.push_async_callback(self._close_supervisor_link)  # after the driver's exit
        await stack.enter_async_context(driver)  # its identity provider exists once it is entered
        keys = replace(keys, egress=await _egress_trust(self.config, driver, keys.secrets_key))
        self._parts = parts = assemble(
            self.config, store=store, driver=driver, keys=keys, replica_id=_replica_id(self.config.replicas.id)
        )
        stack.push_async_callback(parts.records.flush_deferred)  # after the sessions' last writes
        stack.push_async_callback(parts.egress.aclose)  # before the driver's exit: no connection outlives its sandbox
        if self.config.network.proxy_listen:
            host, _, port = self.config.network.proxy_listen.rpartition(":")
            self.egress_port = await parts.egress.proxy.listen(host.strip("[]"), int(port), parts.egress.admit)
        others = await parts.replication.live_others() if parts.replication is not None else frozenset[str]()
        await parts.reconciler.startup(live_owners=others)
        servers = await self._listen(stack, parts)
        if parts.replication is not None:
            running = parts.replication.running(
                listen_tcp=self.config.listen_tcp, tcp_port=self.tcp_port, leading=parts.leading, records=parts.records
            )
            await stack.enter_async_context(running)
        self._write_runtime_info()
        # Ready only once announced: a probe that sees 200 finds gateway.json and the replica row.
        self._phase = _Phase.SERVING
        await driver.start(parts.activator)
        if parts.leadership is not None:
            parts.leadership.campaign()
        stack.push_async_callback(self._loops.aclose)
        self._loops.start(parts.reconciler.run_watch(), name="driver-watch")
        self._loops.start(parts.reconciler.run_relist(), name="relist")
        self._loops.start(parts.expiry.run(), name="expiry")
        stack.push_async_callback(self._close_doors, servers, parts)  # the first step of a stop
        log.info(
            "gateway serving on %s (http %s:%d, driver %s)",
            self.paths.socket,
            self.config.http_host,
            self.http_port,
            driver.name,
        )

    async def _open_store(self, stack: contextlib.AsyncExitStack) -> Store:
        with statedir.private_umask():
            store = await opening.open_store(
                self.config.store, default_sqlite=self.paths.database, progress=self._opening
            )
        stack.push_async_callback(store.aclose)
        return store

    def _new_server(self, parts: GatewayParts, gate: listening.StopGate) -> grpc.aio.Server:
        config = self.config
        return listening.new_server(
            max_connections=config.max_connections,
            max_receive_bytes=config.max_request_bytes,
            handshake_timeout_seconds=config.handshake_timeout_seconds,
            connection_idle_seconds=config.connection_idle_seconds,
            max_connection_age_seconds=parts.wiring.max_connection_age_seconds,
            interceptors=(gate,),
        )

    async def _listen(self, stack: contextlib.AsyncExitStack, parts: GatewayParts) -> listening.Servers:
        """Bind the sockets (private from the moment they exist) and TCP, and serve. The public
        socket and TCP serve both APIs (supervisors in pods come in over TCP); supervisor.sock
        serves the supervisor API alone."""
        gate = listening.StopGate()
        public, supervisors = self._new_server(parts, gate), self._new_server(parts, gate)
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(parts.sandbox_service, public)
        sandbox_pb2_grpc.add_FileServiceServicer_to_server(parts.file_service, public)
        image_pb2_grpc.add_ImageServiceServicer_to_server(parts.image_service, public)
        for server in (public, supervisors):
            supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(parts.supervisor_service, server)
        servers = listening.Servers((public, supervisors), gate)
        stack.callback(self._remove_files)  # only a gateway that bound the sockets removes them
        with statedir.private_umask():
            for path, server in ((self.paths.socket, public), (self.paths.supervisor_socket, supervisors)):
                path.unlink(missing_ok=True)
                server.add_insecure_port(f"unix://{path}")
            if self.config.listen_tcp:
                self.tcp_port = public.add_insecure_port(self.config.listen_tcp)
            if (stream := parts.byte_stream) is not None:
                stack.push_async_callback(stream.aclose)
                stream.listen_unix(self.paths.transfer_socket)
                if self.config.listen_tcp:
                    stream.listen_tcp(
                        self.config.listen_tcp.rpartition(":")[0].strip("[]"), self.config.files.transfer_port
                    )
        # Bound above (gRPC binds when a port is added); served only once the umask is back, so
        # that no call runs under it (an image import reads it once per layer).
        await servers.start()
        stack.push_async_callback(servers.wait_stopped)
        os.chmod(self.paths.socket, 0o600)
        os.chmod(self.paths.supervisor_socket, 0o600)
        return servers

    async def _close_doors(self, servers: listening.Servers, parts: GatewayParts) -> None:
        """Refuse new calls first ("gateway stopping"), and give the execs in flight
        `exec_drain_seconds` to finish; then close the connections (GOAWAY: clients retry on
        another replica) and end the streams: a supervisor told to reconnect, or a watcher told
        to watch again, must not find this gateway again but another replica (or this one's
        successor). An exec that could not finish ends UNAVAILABLE, as after a crash."""
        self._phase = _Phase.STOPPING
        servers.refuse_new_calls()
        drain = self.config.exec_drain_seconds
        if left := await parts.execs.wait_none_in_flight(0):
            log.info("stopping: %d exec(s) in flight get up to %gs to finish", left, drain)
            if left := await parts.execs.wait_none_in_flight(drain):
                log.warning("stopping: %d exec(s) did not finish in %gs; they end UNAVAILABLE", left, drain)
        servers.begin_stop()
        if parts.supervisor_link is not None:
            parts.supervisor_link.close()
        await asyncio.sleep(0)  # let the servers' stop begin before the streams end
        parts.manager.close()
        parts.bus.close_all()
        parts.sessions.close_all(_GOING_AWAY, ends_execs=_exec_not_finished)
        await parts.background.aclose()
        parts.registry.close_all(_GOING_AWAY)

    async def _close_supervisor_link(self) -> None:
        """End the in-process supervisor sessions still running (a driver whose supervisors run
        in this process ends most of them itself, with its supervisors)."""
        if self._parts is not None and self._parts.supervisor_link is not None:
            await self._parts.supervisor_link.aclose()

    def _remove_files(self) -> None:
        self.paths.runtime_info.unlink(missing_ok=True)
        for path in (self.paths.socket, self.paths.supervisor_socket):
            path.unlink(missing_ok=True)

    async def _refresh_usage(self) -> None:
        """Before a /metrics page: the per-sandbox gauges, once the gateway has its parts."""
        if self._parts is not None:
            await self._parts.usage_gauges.refresh()

    async def _healthy(self) -> str | None:
        """/healthz: None while serving, else why not."""
        phase = self._phase
        if phase is _Phase.OPENING:
            return f"not serving: {self._opening.problem() or phase.value}"
        if phase is not _Phase.SERVING:
            return f"not serving: {phase.value}"
        try:
            await self.parts.store.ping()
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
        if self.egress_port:
            egress_host = self.config.network.proxy_listen.rpartition(":")[0]
            info["egress"] = f"{egress_host}:{self.egress_port}"
        tmp = self.paths.runtime_info.with_suffix(".tmp")
        # Its mode given, not the private umask: the umask is the process's, and the gateway is
        # serving by now (an image import in a thread takes it as what its files' modes lose).
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w") as handle:
            handle.write(json.dumps(info) + "\n")
        tmp.replace(self.paths.runtime_info)

    async def drain(self) -> None:
        """Before a stop (SIGTERM), as one of several replicas: keep serving for
        `replicas.drain_seconds` while /healthz says NotServing, so the Service stops sending
        new connections here and the existing ones go away gracefully (their age limit)."""
        if self._parts is None or self._parts.replication is None or not self.config.replicas.drain_seconds:
            return
        self._phase = _Phase.DRAINING
        log.info("draining for %gs before stopping", self.config.replicas.drain_seconds)
        await asyncio.sleep(self.config.replicas.drain_seconds)

    async def stop(self) -> None:
        """Graceful stop: what started is stopped in reverse, beginning with refusing new calls
        and ending the sessions, then the loops, the servers' grace, the driver and the store."""
        if self._phase is _Phase.IDLE:  # never started, refused before it opened anything, or stopped
            return
        self._phase = _Phase.STOPPING
        try:
            await self._stack.aclose()
        finally:
            self._phase = _Phase.IDLE
        log.info("gateway stopped")


async def _egress_trust(config: GatewayConfig, driver: ComputeDriver, secrets_key: bytes) -> EgressTrust:
    """What the egress proxy reads before it is built: the CA that intercepts TLS for
    placeholder secrets (where the driver binds proxy sockets into sandboxes, the gateway's own;
    where pods reach the proxy over the network, one derived from the secrets key, so every
    replica has it) and the upstreams' trust. FailedPreconditionError, in one line, when either
    cannot be read or made: the gateway does not start."""
    authority = None
    if isinstance(driver, HostsEgressSockets):
        directory = config.paths.root / "egress"
        authority = await asyncio.to_thread(interception.CertificateAuthority, directory)
        await asyncio.to_thread(driver.share_authority, authority.certificate_pem)
    elif config.network.proxy_url:
        # Its own directory: a local gateway's CA key next to a derived certificate would not pair.
        directory = config.paths.root / "egress-shared"
        authority = await asyncio.to_thread(interception.CertificateAuthority, directory, seed=secrets_key)
    upstream = await asyncio.to_thread(interception.upstream_context, config.network.upstream_ca_file)
    return EgressTrust(authority, upstream)


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
        gateway.parts.manager.busy, interval=config.gc_full_interval_seconds, overdue=config.gc_full_overdue_seconds
    )
    collecting = asyncio.create_task(full.run(), name="full-collections")
    try:
        await stopped
        await gateway.drain()
    finally:
        collecting.cancel()
        await gateway.stop()
