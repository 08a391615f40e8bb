"""The gateway's composition root: every part of one gateway built and wired to the others, in
one synchronous step without I/O. What needs I/O first (the store opened, the keys read, the
driver entered) is done before and passed in; starting the parts is `server.Gateway`'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core import lifetimes
from warmshell.core.config import GatewayConfig
from warmshell.core.deadlines import ProvisioningDeadlines
from warmshell.drivers.base import ComputeDriver, Leadership
from warmshell.drivers.files import FilesCapable
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.background import BackgroundProcesses
from warmshell.gateway.bytestream import ByteStream
from warmshell.gateway.egress.credentials import ProxyCredentials
from warmshell.gateway.egress.gate import EgressGate, EgressTrust, HostsEgressSockets, NetworkProxy
from warmshell.gateway.egress.proxy import EgressProxy
from warmshell.gateway.events import EventBus
from warmshell.gateway.execs import ExecRelay
from warmshell.gateway.expiry import ExpiryReconciler
from warmshell.gateway.file_service import FileService
from warmshell.gateway.image_service import ImageService
from warmshell.gateway.inprocess import HostsSupervisors, InProcessLink
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.ratelimits import RateLimiter
from warmshell.gateway.reconciler import Reconciler
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.registry import Registry
from warmshell.gateway.replication import Replication, ReplicaWiring
from warmshell.gateway.sandbox_service import SandboxService
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.sessions import MISSED_HEARTBEATS, SessionTable
from warmshell.gateway.store.base import Store
from warmshell.gateway.store.postgres import PostgresStore
from warmshell.gateway.store.sqlite import SqliteStore
from warmshell.gateway.supervisor_service import SupervisorService
from warmshell.gateway.tickets import TicketBook
from warmshell.gateway.tokens import SandboxTokenIssuer
from warmshell.gateway.usage import UsageGauges

__all__ = ["GatewayParts", "Keys", "assemble"]


@dataclass(frozen=True)
class Keys:
    """The credentials a gateway reads (or creates) in its state directory before it is built."""

    api_token: str  # clients' bearer token
    gateway_id: str  # part of the sandbox tokens' audience
    signing_key: Ed25519PrivateKey  # signs sandbox tokens
    secrets_key: bytes  # seals the secrets stored with sandboxes
    replica_token: str = ""  # the credential replicas share; "" for a lone gateway
    egress: EgressTrust = field(default_factory=EgressTrust)  # the egress proxy's CA, read once the driver is entered


@dataclass(frozen=True)
class GatewayParts:
    """One gateway's parts, wired to each other: nothing in it has started but the store and
    the driver it was built on."""

    config: GatewayConfig
    store: Store
    driver: ComputeDriver
    bus: EventBus
    records: SandboxRecords
    sessions: SessionTable
    registry: Registry[spb.SupervisorActivationMessage]
    issuer: SandboxTokenIssuer
    vault: SecretVault
    activator: GatewayActivator
    manager: SandboxManager
    auth: Authenticator
    execs: ExecRelay
    background: BackgroundProcesses
    reconciler: Reconciler
    expiry: ExpiryReconciler
    sandbox_service: SandboxService
    file_service: FileService
    image_service: ImageService
    supervisor_service: SupervisorService
    usage_gauges: UsageGauges
    # Present only where it exists: supervisors hosted in this process (the local driver), several
    # replicas on a shared store, a driver that elects a leader among replicas.
    supervisor_link: InProcessLink | None
    replication: Replication | None
    leadership: Leadership | None
    leading: Callable[[], bool]  # whether this gateway does the singleton work now
    wiring: ReplicaWiring
    egress: EgressGate
    # The byte stream for file transfers, when offered (`files.transfer_stream`, a driver that
    # reaches its sandboxes' files from the gateway's host); its listeners open with the gateway's.
    byte_stream: ByteStream | None = None


def _execs(config: GatewayConfig, manager: SandboxManager) -> tuple[ExecRelay, BackgroundProcesses]:
    """The exec relay, and the background commands kept over it."""
    execs = ExecRelay(window_bytes=config.exec_output_window_bytes, stall_seconds=config.exec_stall_timeout_seconds)
    background = BackgroundProcesses(execs, history_bytes=config.exec_history_bytes, touch=manager.touch)
    manager.records.observe(background.observe)
    return execs, background


def _authentication(
    config: GatewayConfig, keys: Keys, driver: ComputeDriver
) -> tuple[SandboxTokenIssuer, Authenticator]:
    """The sandbox token issuer, and the authenticator of every caller (clients, supervisors, replicas)."""
    issuer = SandboxTokenIssuer(
        keys.signing_key, gateway_id=keys.gateway_id, ttl_seconds=config.sandbox_token_ttl_seconds
    )
    auth = Authenticator(
        api_token=keys.api_token, issuer=issuer, identity=driver.identity, replica_token=keys.replica_token
    )
    return issuer, auth


def _files(config: GatewayConfig, manager: SandboxManager, auth: Authenticator, wiring: ReplicaWiring) -> FileService:
    """The FileService, with the byte stream it issues tickets for when one is offered."""
    service = FileService(manager, auth, config.files, wiring.forwarder)
    files = config.files
    if files.transfer_stream and isinstance(manager.driver, FilesCapable):
        book = TicketBook(ttl_seconds=files.transfer_ticket_seconds, clock=time.monotonic)
        service.offer_stream(
            ByteStream(
                book,
                service.files_for_grant,
                hello_seconds=files.transfer_idle_seconds,
                idle_seconds=files.transfer_idle_seconds,
                max_connections=files.transfer_max_connections,
                limits=service.archive_limits(),
            )
        )
    return service


def assemble(
    config: GatewayConfig, *, store: Store, driver: ComputeDriver, keys: Keys, replica_id: str = ""
) -> GatewayParts:
    """Build one gateway's parts on an opened `store` and an entered `driver` (the Kubernetes
    driver's identity exists only then); on a shared (Postgres) store, as replica `replica_id`."""
    bus = EventBus()
    # A SQLite file has one gateway (replicas need Postgres), so its records may be cached.
    records = SandboxRecords(store, bus, exclusive=isinstance(store, SqliteStore))
    issuer, auth = _authentication(config, keys, driver)
    replication = _replication(config, store, replica_id=replica_id, token=keys.replica_token, auth=auth, bus=bus)
    wiring = replication.wiring if replication is not None else ReplicaWiring()
    heartbeat_window_ms = int(MISSED_HEARTBEATS * config.heartbeat_interval_seconds * 1000)
    sessions = SessionTable(window_ms=heartbeat_window_ms, owner=wiring.owner)
    registry: Registry[spb.SupervisorActivationMessage] = Registry()
    vault = SecretVault(store, keys.secrets_key)
    egress = _egress(config, driver, records, keys.egress, vault=vault, secrets_key=keys.secrets_key)
    activator = GatewayActivator(registry, records, issuer, vault, egress)
    manager = _manager(config, records=records, driver=driver, bus=bus, sessions=sessions, vault=vault)
    execs, background = _execs(config, manager)
    supervisor_service = _supervisor_service(config, manager, registry, activator, issuer, auth, wiring, background)
    leadership = driver if replication is not None and isinstance(driver, Leadership) else None
    leading = _leader(leadership)
    reconciler, expiry = _reconcilers(config, manager, leading=leading, wiring=wiring)
    file_service = _files(config, manager, auth, wiring)
    return GatewayParts(
        config=config,
        store=store,
        driver=driver,
        bus=bus,
        records=records,
        sessions=sessions,
        registry=registry,
        issuer=issuer,
        vault=vault,
        activator=activator,
        manager=manager,
        auth=auth,
        execs=execs,
        background=background,
        reconciler=reconciler,
        expiry=expiry,
        sandbox_service=SandboxService(manager, auth, execs, wiring.forwarder, egress=egress, background=background),
        file_service=file_service,
        image_service=ImageService.for_config(config, auth),
        supervisor_service=supervisor_service,
        usage_gauges=UsageGauges.for_config(config.metrics, driver, records),
        supervisor_link=_in_process_link(driver, supervisor_service),
        replication=replication,
        leadership=leadership,
        leading=leading,
        wiring=wiring,
        egress=egress,
        byte_stream=file_service.stream,
    )


def _egress(
    config: GatewayConfig,
    driver: ComputeDriver,
    records: SandboxRecords,
    trust: EgressTrust,
    *,
    vault: SecretVault,
    secrets_key: bytes,
) -> EgressGate:
    """The egress proxy and the gate that opens it at each activation (sockets where the driver
    binds them into sandboxes: the local driver; else, with `[network] proxy_url`, a credential
    per sandbox for the proxy's network listener), closing it as records end."""
    sockets = driver if isinstance(driver, HostsEgressSockets) else None
    network = None
    if sockets is None and config.network.proxy_url:
        network = NetworkProxy(config.network.proxy_url, ProxyCredentials(secrets_key), records, vault)
    proxy = EgressProxy(config.network, authority=trust.authority, upstream_tls=trust.upstream_tls)
    gate = EgressGate(config.network, proxy, sockets, pools=driver.pools, authority=trust.authority, network=network)
    records.observe(gate.observe)
    return gate


def _reconcilers(
    config: GatewayConfig, manager: SandboxManager, *, leading: Callable[[], bool], wiring: ReplicaWiring
) -> tuple[Reconciler, ExpiryReconciler]:
    """The loops that keep records and backends agreeing, and that end sandboxes past their time."""
    reconciler = Reconciler(
        manager,
        interval_seconds=config.reconcile_interval_seconds,
        orphan_grace_seconds=config.orphan_grace_seconds,
        leading=leading,
        share_progress=wiring.share_progress,
    )
    expiry = ExpiryReconciler(
        manager,
        interval_seconds=config.lifetimes.check_interval_seconds,
        leading=leading,
        exited_retention_seconds=config.lifetimes.exited_retention_seconds,
    )
    return reconciler, expiry


def _replication(
    config: GatewayConfig, store: Store, *, replica_id: str, token: str, auth: Authenticator, bus: EventBus
) -> Replication | None:
    """This gateway as one of several replicas, when its store is shared (Postgres): the one
    place a shared store makes a difference."""
    if not isinstance(store, PostgresStore):
        return None
    return Replication(
        store,
        config=config.replicas,
        replica_id=replica_id,
        token=token,
        auth=auth,
        bus=bus,
        connect_timeout_seconds=config.store.connect_timeout_seconds,
    )


def _in_process_link(driver: ComputeDriver, service: SupervisorService) -> InProcessLink | None:
    """The link a driver whose supervisors run in the gateway process (the local driver) reaches
    the supervisor API through: no socket between them."""
    if not isinstance(driver, HostsSupervisors):
        return None
    link = InProcessLink(service)
    driver.supervise_in_process(link)
    return link


def _leader(leadership: Leadership | None) -> Callable[[], bool]:
    """Whether this gateway does the singleton work now: a lone one always does, a replica while
    it holds the driver's lease."""

    def leading() -> bool:
        return leadership is None or leadership.leading()

    return leading


def _manager(
    config: GatewayConfig,
    *,
    records: SandboxRecords,
    driver: ComputeDriver,
    bus: EventBus,
    sessions: SessionTable,
    vault: SecretVault,
) -> SandboxManager:
    lifetime = config.lifetimes
    return SandboxManager(
        records=records,
        driver=driver,
        bus=bus,
        sessions=sessions,
        vault=vault,
        deadlines=ProvisioningDeadlines(
            cold_seconds=config.provisioning_deadline_seconds, warm_seconds=config.warm_activation_deadline_seconds
        ),
        limits=lifetimes.Limits(
            default_ttl_seconds=lifetime.default_ttl_seconds,
            max_ttl_seconds=lifetime.max_ttl_seconds,
            default_idle_timeout_seconds=lifetime.default_idle_timeout_seconds,
            max_idle_timeout_seconds=lifetime.max_idle_timeout_seconds,
            pause_ttl_seconds=lifetime.pause_ttl_seconds,
        ),
    )


def _supervisor_service(
    config: GatewayConfig,
    manager: SandboxManager,
    registry: Registry[spb.SupervisorActivationMessage],
    activator: GatewayActivator,
    issuer: SandboxTokenIssuer,
    auth: Authenticator,
    wiring: ReplicaWiring,
    background: BackgroundProcesses,
) -> SupervisorService:
    limits = config.rate_limits
    delay = limits.refusal_delay_seconds
    return SupervisorService(
        manager=manager,
        identity=manager.driver.identity,
        registry=registry,
        activator=activator,
        issuer=issuer,
        auth=auth,
        heartbeat_interval_seconds=config.heartbeat_interval_seconds,
        registrations=RateLimiter("registration", limits.registration, refusal_delay_seconds=delay),
        token_refreshes=RateLimiter("token_refresh", limits.token_refresh, refusal_delay_seconds=delay),
        replicas=wiring.directory,
        adopt=background.adopt,
    )
