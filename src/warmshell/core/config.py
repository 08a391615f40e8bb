"""Gateway configuration: defaults < TOML file < environment (WARMSHELL_*) < CLI flags.

The well-known paths under the state directory live in `warmshell.core.paths` (re-exported here),
which the CLI reads without paying for pydantic.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from warmshell.core import egress, quantities
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.paths import StatePaths, default_state_dir

__all__ = [
    "DEFAULT_EXEC_HISTORY_BYTES",
    "DEFAULT_EXEC_WINDOW_BYTES",
    "FilesConfig",
    "GatewayConfig",
    "KubernetesDriverConfig",
    "LeaderElectionConfig",
    "LifetimesConfig",
    "LocalDriverConfig",
    "MetricsConfig",
    "NetworkConfig",
    "ProfilesConfig",
    "RateLimit",
    "RateLimitsConfig",
    "ReplicasConfig",
    "StatePaths",
    "StoreConfig",
    "WarmPoolingConfig",
    "default_state_dir",
    "load_config",
]


DEFAULT_EXEC_WINDOW_BYTES = 4 * 1024 * 1024
# A background command's output ring (gateway.exec_history_bytes).
DEFAULT_EXEC_HISTORY_BYTES = 512 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalDriverConfig(_Section):
    """The embedded default driver: sandboxes are bubblewrap + a tiny agent, their supervisors
    run in the gateway."""

    bwrap: str = "bwrap"
    # Without bubblewrap the driver refuses to start unless the operator opts in to running
    # workloads as plain processes (no isolation at all).
    allow_unisolated: bool = False
    pools_dir: Path | None = None
    max_pool_replicas: int = Field(default=64, ge=1)
    # Host paths every sandbox also sees, read-only, at the same path (each logged at start).
    extra_ro_binds: list[Path] = Field(default_factory=list)
    # Directories whose subdirectories a create's or profile's `image` may name as its root
    # filesystem (directories only the operator can write); an image anywhere else is refused.
    # Empty: no image roots, only "" (the host's own paths, read-only).
    image_roots: list[Path] = Field(default_factory=list)
    # The image store (`warmshell image import`): None = <state_dir>/images. Its filesystem must
    # keep user.* extended attributes (the layers' overlayfs whiteouts): ext4, xfs, btrfs, tmpfs.
    image_dir: Path | None = None
    # Uncompressed layer bytes the store may hold; an import that would pass it is refused.
    image_store_size: str = "20Gi"
    # Layers a snapshot's image may have: past it the snapshot is one layer of the whole root
    # (flattened). Every layer is a mount and a lower directory overlayfs searches on a lookup.
    max_layers: int = Field(default=32, ge=2, le=120)
    # Children one fork may make (each is a sandbox on the parent's snapshot: no copy of its files).
    max_fork_count: int = Field(default=32, ge=1, le=1000)
    # A gateway run as root gives each sandbox its own host uid from this range (unused on the
    # host, please); a gateway run by a normal user runs them as that user.
    sandbox_uid_base: int = Field(default=2_000_000, ge=1000, le=2**31 - 2)
    sandbox_uid_count: int = Field(default=60_000, ge=1, le=2**30)
    # With a uid per sandbox, workspaces (and a copy of the agent) live here, where those uids
    # can reach them: root-owned 0711, each workspace 0700 and owned by its sandbox.
    sandbox_dir: Path = Path("/var/lib/warmshell-sandboxes")
    # With a uid per sandbox, what a sandbox needs only while it lives (its egress directory,
    # with a ~220 KB CA bundle for one whose TLS the proxy intercepts, its uid lease and,
    # with nothing on disk, its log) lives here: root-owned 0711, best a tmpfs. None = a
    # directory named for sandbox_dir on /run or else /dev/shm, whichever is a tmpfs; neither:
    # sandbox_dir.
    runtime_dir: Path | None = None

    @field_validator("extra_ro_binds", "sandbox_dir", "image_roots", "image_dir", "runtime_dir")
    @classmethod
    def _absolute(cls, value: list[Path] | Path | None) -> list[Path] | Path | None:
        for path in value if isinstance(value, list) else [value] if value is not None else []:
            if not path.is_absolute():
                raise ValueError(f"{str(path)!r} must be an absolute path")
        return value

    @field_validator("image_store_size")
    @classmethod
    def _a_size(cls, value: str) -> str:
        try:
            quantities.memory_bytes(value, field="image_store_size")
        except InvalidArgumentError as exc:
            raise ValueError(exc.rule) from exc
        return value

    @field_validator("image_roots")
    @classmethod
    def _not_the_host_root(cls, value: list[Path]) -> list[Path]:
        # "/" would allow every directory of the host with a usr/ in it: the allow-list's opposite.
        for path in value:
            if path == Path("/"):
                raise ValueError("'/' would allow any host directory as an image: name the directories of images")
        return value

    pool_reload_interval_seconds: float = Field(default=1.0, gt=0)
    # Deprecated and ignored (a warning at start): refills no longer wait for a pause of this
    # length (the refill rule: `PoolSet._refill` in drivers/local/pools/pooling.py).
    refill_delay_seconds: float | None = Field(default=None, ge=0)
    # Pool members start at this nice value, below the creates and activations they serve (a
    # claimed one gets 0 back before its workload starts); 0 = the gateway's own priority.
    refill_nice: int = Field(default=19, ge=0, le=19)
    # Default bounds of every sandbox (see drivers/local/runtime/limits.py): sized tmpfs, the largest
    # file a process may write, and how many processes it may run. A profile's [storage] and
    # [resources], and a request's resources, override them (up to the maximums below).
    # /workspace is a tmpfs of this size ("" = a directory on the host's disk, with no bound).
    workspace_size: str = "1Gi"
    tmp_size: str = "256Mi"
    # The writable layer over an image's layers (a sandbox from an image of the image store): a
    # tmpfs, so writes into the image's directories count against memory like /tmp's.
    root_size: str = "1Gi"
    run_size: str = "16Mi"
    shm_size: str = "64Mi"
    max_file_size: str = "4Gi"
    max_processes: int = Field(default=1024, ge=16, le=2**22)  # the default process count
    # Descriptors per sandbox process (RLIMIT_NOFILE); fewer where the sandbox's process count
    # times this would pass a quarter of the host's fs.file-max (drivers/local/runtime/limits.py).
    max_open_files: int = Field(default=1024, ge=64, le=2**20)
    # cpu and memory of a sandbox that asks for none ("" = no limit); need a cgroup (v2
    # delegated, or the v1 controllers writable: a root gateway), else they are best-effort.
    default_cpu: str = "1"
    default_memory: str = "2Gi"
    # A create or profile that asks for cpu, memory or pids this host cannot enforce is refused
    # (FailedPrecondition naming the field) unless this is true; then it runs unbounded in that
    # resource and its ResourceLimits condition says so.
    allow_unenforced_limits: bool = False
    # Requests (and profiles) beyond these are refused, naming the field; "" = the host's cpus
    # and memory, and for /workspace and /tmp the host's memory (they are tmpfs).
    max_cpu: str = ""
    max_memory: str = ""
    max_pids: int = Field(default=32768, ge=16, le=2**22)
    max_storage_size: str = ""
    # An idle member's agent must answer a ping this fast when a create claims it (a stopped or
    # hung member is spent and replaced; the create takes the next member or goes cold).
    member_probe_seconds: float = Field(default=1.0, gt=0, le=60)
    # Every idle member is pinged this often (the same deadline); one that does not answer is
    # spent and replaced before a create could claim it.
    member_check_seconds: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _defaults_within_maximums(self) -> LocalDriverConfig:
        # Here rather than at the first create: a default above its maximum would make every
        # create that leaves the value unset fail with a rule its caller never broke. A maximum
        # of "" means the host's own size, which core cannot read; the driver checks requests
        # against that.
        for default_key, maximum_key, amount in (
            ("default_cpu", "max_cpu", quantities.cpu_millis),
            ("default_memory", "max_memory", quantities.memory_bytes),
            ("workspace_size", "max_storage_size", quantities.memory_bytes),
            ("tmp_size", "max_storage_size", quantities.memory_bytes),
        ):
            default, maximum = getattr(self, default_key), getattr(self, maximum_key)
            if not (default and maximum):
                continue
            try:
                over = amount(default, field=default_key) > amount(maximum, field=maximum_key)
            except InvalidArgumentError as exc:  # pydantic reports a ValueError as this key's rule
                raise ValueError(str(exc)) from exc
            if over:
                raise ValueError(f"{default_key} ({default}) is more than {maximum_key} ({maximum})")
        if self.max_processes > self.max_pids:
            raise ValueError(f"max_processes ({self.max_processes}) is more than max_pids ({self.max_pids})")
        return self


class ProfilesConfig(_Section):
    """The profile reconciler: ConfigMaps holding `warm-pool.toml` become agent-sandbox warm pools."""

    # Off by default: it writes SandboxTemplates and SandboxWarmPools, which needs extra RBAC.
    enabled: bool = False
    # Replicas above this are capped (a profile cannot size the cluster on its own).
    max_replicas: int = Field(default=20, ge=1)
    # A full pass over every profile even without events (repairs drift, retries quietly).
    resync_seconds: float = Field(default=300.0, gt=0)


class WarmPoolingConfig(_Section):
    """Warm pools on Kubernetes: claim allocation, and the profiles that generate pools."""

    # Off by itself (one warning) while the agent-sandbox extension CRDs are absent, and on again
    # once they are installed — no restart.
    enabled: bool = True
    profiles: ProfilesConfig = Field(default_factory=ProfilesConfig)


class LeaderElectionConfig(_Section):
    """The `coordination.k8s.io` Lease that picks the one replica running cluster-wide reconcilers."""

    lease_name: str = "warmshell-profiles"
    lease_namespace: str = ""  # "" = the sandbox namespace
    # A holder that has not renewed for this long is presumed dead and may be replaced.
    # Whole seconds: the Lease's spec.leaseDurationSeconds is an integer.
    lease_duration_seconds: int = Field(default=15, ge=1)
    # A holder that cannot renew within this stops leading (before anyone may take over).
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    retry_period_seconds: float = Field(default=2.0, gt=0)
    # The hostname, read without socket: core does no I/O (an import-linter contract).
    identity: str = Field(default_factory=lambda: f"{os.uname().nodename}-{os.getpid()}")


class KubernetesDriverConfig(_Section):
    """The scale-out driver on agent-sandbox: each sandbox is a `Sandbox` object (one pod)."""

    # Credentials: "auto" = in-cluster when KUBERNETES_SERVICE_HOST is set, else the kubeconfig
    # (`kubeconfig`, else $KUBECONFIG, else ~/.kube/config).
    credentials: Literal["auto", "in-cluster", "kubeconfig"] = "auto"
    kubeconfig: str = ""
    context: str = ""
    # Only "shared" for now: one namespace, objects named {workspace}--{name}.
    namespace_mode: Literal["shared"] = "shared"
    namespace: str = "warmshell"
    # The gateway's supervisor API as pods reach it (gRPC target, e.g. "warmshell.warmshell.svc:8443").
    gateway_address: str = ""
    service_account: str = "warmshell-sandbox"
    image: str = "ghcr.io/warmshell/warmshell:0.1.0"
    image_pull_policy: Literal["", "Always", "IfNotPresent", "Never"] = ""
    token_audience: str = "warmshell-gateway"
    # Projected token lifetime; the kubelet rotates it at 80 %. Kubernetes accepts 600 s .. 2^32 s.
    token_expiration_seconds: int = Field(default=3600, ge=600, le=86400)
    # Every API call is bounded by this; watches by watch_timeout_seconds plus this.
    api_timeout_seconds: float = Field(default=10.0, gt=0)
    watch_timeout_seconds: int = Field(default=290, ge=1)
    # Delays between attempts of retryable calls (429, 5xx, timeouts); the length is the retry count.
    retry_delays_seconds: list[float] = Field(default_factory=lambda: [0.1, 0.5, 1.0, 2.0])
    termination_grace_seconds: int = Field(default=10, ge=0)
    # The uid the supervisor runs as (the project image's non-root user).
    run_as_user: int = Field(default=10001, ge=1)
    # AES-256-GCM key sealing activation proofs on Sandbox objects; "" = <state_dir>/kubernetes-proof.key.
    # Gateways sharing a store must share this key (mount it from a Secret).
    proof_key_file: str = ""
    warm_pooling: WarmPoolingConfig = Field(default_factory=WarmPoolingConfig)
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    # /workspace on a PersistentVolumeClaim per sandbox, made and kept by agent-sandbox from the
    # Sandbox's volumeClaimTemplates: it outlives the pod, so a pause (Suspended) keeps its files.
    # This size unless a profile's [storage] workspace says otherwise; "" = an emptyDir, which
    # goes with the pod (no storage provisioner needed). Pool members each hold one too.
    workspace_claim_size: str = ""
    # The claims' StorageClass ("" = the cluster's default).
    workspace_storage_class: str = ""

    @field_validator("workspace_claim_size")
    @classmethod
    def _a_claim_size(cls, value: str) -> str:
        if value:
            try:
                quantities.memory_bytes(value, field="workspace_claim_size")
            except InvalidArgumentError as exc:
                raise ValueError(exc.rule) from exc
        return value


class RateLimit(_Section):
    """A token bucket: up to `burst` calls at once, then `per_second` on average."""

    per_second: float = Field(gt=0)
    burst: int = Field(ge=1)


class RateLimitsConfig(_Section):
    """Per-instance limits on the supervisor calls a stolen credential could repeat. A supervisor
    registers once per start and refreshes its token at 80 % of its lifetime, far below these."""

    registration: RateLimit = Field(default_factory=lambda: RateLimit(per_second=0.2, burst=5))
    token_refresh: RateLimit = Field(default_factory=lambda: RateLimit(per_second=0.1, burst=5))
    # A refused call is answered only after this delay, so a loop waits instead of spinning the
    # gateway's event loop with refusals (a real supervisor backs off for longer anyway).
    refusal_delay_seconds: float = Field(default=1.0, ge=0, le=30)


class FilesConfig(_Section):
    """`[files]`: limits of the FileService (reads and writes stream, so these bound disk, not memory)."""

    max_file_bytes: int = Field(default=8 * 1024**3, ge=1)
    # Each ReadFile message; below the gateway's max_request_bytes so a client reads with the defaults.
    chunk_bytes: int = Field(default=256 * 1024, ge=1024, le=4 * 1024 * 1024)
    # One archive transfer (UploadTar, DownloadTar): its entries; its content is bounded by
    # max_file_bytes, and the sandbox's disk bound applies as for any write.
    max_archive_entries: int = Field(default=100_000, ge=1)
    # The byte stream: a file's or an archive's bytes over a plain socket admitted by a
    # one-time ticket (`OpenFileTransfer`), at under half the gateway's CPU per MiB of gRPC
    # messages; the SDK uses it when offered. false = not offered (every transfer goes over
    # gRPC). Local driver only.
    transfer_stream: bool = True
    # A ticket is accepted once, within this long of being issued.
    transfer_ticket_seconds: float = Field(default=30.0, gt=0, le=600)
    # A connection must send its ticket, and then make progress, within this long.
    transfer_idle_seconds: float = Field(default=30.0, gt=0)
    transfer_max_connections: int = Field(default=256, ge=1)
    # Its TCP port when the gateway listens on TCP (on `listen_tcp`'s host); 0 = any free port.
    transfer_port: int = Field(default=0, ge=0, le=65535)


class MetricsConfig(_Section):
    """`[metrics]`: what /metrics lists per sandbox. Each listed sandbox is a Prometheus series
    per figure, kept by the server for hours after the sandbox is gone: the top
    `per_sandbox_limit` by cpu are listed (0 = none), read at most once every
    `per_sandbox_refresh_seconds` however often the page is scraped (gateway/usage.py)."""

    per_sandbox_limit: int = Field(default=50, ge=0, le=1000)
    per_sandbox_refresh_seconds: float = Field(default=10.0, ge=0)


class LifetimesConfig(_Section):
    """How long sandboxes live: the TTL and idle timeout a create gets when it sets none, the
    most it may ask for (0 = no maximum), how long an Exited sandbox is kept, and how often
    expiry is checked.

    Finite by default, so a harness that crashes before its deletes leaks sandboxes for an
    hour, not forever; sandboxes that live until deleted are the operator's explicit choice
    (`default_ttl_seconds = 0` with `max_ttl_seconds = 0`)."""

    default_ttl_seconds: int = Field(default=3600, ge=0)  # 0 = until deleted (needs max_ttl_seconds = 0)
    max_ttl_seconds: int = Field(default=86400, ge=0)
    default_idle_timeout_seconds: int = Field(default=0, ge=0)
    max_idle_timeout_seconds: int = Field(default=0, ge=0)
    # A sandbox whose workload exited (a one-shot `create -- CMD` without --rm) is deleted this
    # long after the exit, whatever its TTL says (0 = kept as long as its TTL).
    exited_retention_seconds: int = Field(default=600, ge=0)
    # A Paused sandbox never resumed is deleted (its files with it) this long after its pause
    # (0 = kept until deleted); a pause may ask for another.
    pause_ttl_seconds: int = Field(default=7 * 86400, ge=0)
    check_interval_seconds: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _defaults_within_maxima(self) -> LifetimesConfig:
        for name in ("ttl_seconds", "idle_timeout_seconds"):
            default, maximum = getattr(self, f"default_{name}"), getattr(self, f"max_{name}")
            if maximum and not 0 < default <= maximum:
                raise ValueError(f"default_{name} must be between 1 and max_{name} ({maximum})")
        return self


class NetworkConfig(_Section):
    """`[network]`: egress of local sandboxes through the gateway's proxy (see core/egress)."""

    # What a sandbox whose profile has no [network] allow list may reach: "none" or "all"
    # ("all" never includes the host's own or private addresses: those need an IP or CIDR rule).
    default: Literal["none", "all"] = "none"
    # Denied to every sandbox, whatever its profile or request allows.
    deny: list[str] = Field(default_factory=list)
    # False: a request's --allow-net only narrows what its profile (or `default`) allows.
    requests_may_widen: bool = False
    # Per sandbox: open connections through the proxy, and bytes per second each way.
    max_connections: int = Field(default=64, ge=1)
    max_bytes_per_second: int = Field(default=50 * 1024 * 1024, ge=1024)
    # A request line plus headers larger than this is refused (431) before anything is forwarded.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=1024 * 1024)
    # Decisions kept per sandbox for `warmshell sandbox egress` (a ring: the oldest go first).
    log_entries: int = Field(default=256, ge=1, le=100_000)
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    # A CA file upstreams are also verified against (besides the host's trust store) when the
    # proxy intercepts TLS for placeholder secrets: for tests and private CAs.
    upstream_ca_file: str = ""
    # Where the proxy also listens for sandboxes that reach it over the network ("HOST:PORT";
    # "" = not at all): Kubernetes pods, each admitted by the credential its activation carried.
    proxy_listen: str = ""
    # The proxy's URL as those pods dial it ("http://HOST:PORT", e.g. the chart's egress
    # Service); "" = pods get no proxy, and the driver's sandboxes have no egress policy applied.
    proxy_url: str = ""

    @field_validator("proxy_listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, colon, port = value.rpartition(":")
        if value and not (colon and host and port.isdigit() and 0 <= int(port) <= 65535):
            raise ValueError('must be "" or "HOST:PORT" with a port from 0 to 65535')
        return value

    @field_validator("proxy_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        rest = value.removeprefix("http://")
        if value and (rest == value or not rest or "@" in rest or "/" in rest.rstrip("/")):
            raise ValueError('must be "" or "http://HOST:PORT" (no user info, no path)')
        return value.rstrip("/")

    @field_validator("deny")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        try:
            egress.parse_rules(value, field="network.deny")
        except InvalidArgumentError as exc:  # pydantic reports ValueErrors with their field
            raise ValueError(f"entry {exc.field.removeprefix('network.deny')}: {exc.rule}") from None
        return value


class StoreConfig(_Section):
    """Where sandbox records live: SQLite in the state directory (the default), or a Postgres
    shared by gateway replicas."""

    # "" = SQLite at <state_dir>/warmshell.db; "sqlite:///PATH"; or "postgresql://user@host:port/db".
    # Secret because a URL may carry a password (a Kubernetes Secret's value): never printed as is.
    url: SecretStr = SecretStr("")
    # The URL is this file's content instead (a mounted Kubernetes Secret); wins over `url`.
    url_file: str = ""
    # The Postgres password: this file's content, else $WARMSHELL_STORE_PASSWORD, else the URL's own.
    password_file: str = ""
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    # Bounds one connection attempt, and (separately) every statement.
    connect_timeout_seconds: float = Field(default=5.0, gt=0)
    statement_timeout_seconds: float = Field(default=10.0, gt=0)
    # How long start-up keeps retrying an unreachable database before it gives up with a clear
    # error; 0 (the default) = for as long as it takes, reporting NotServing on /healthz meanwhile
    # (a database that comes up after the gateway, as on Kubernetes). A refused login, a missing
    # database, an invalid URL or a read-only server fail at once whatever this says.
    startup_timeout_seconds: float = Field(default=0.0, ge=0)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: SecretStr) -> SecretStr:
        value = url.get_secret_value()
        if value and not value.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError('must be empty (SQLite in the state directory), "sqlite:///PATH" or "postgresql://..."')
        return url

    @model_validator(mode="after")
    def _pool_bounds(self) -> StoreConfig:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(
                f"pool_min_size ({self.pool_min_size}) must not exceed pool_max_size ({self.pool_max_size})"
            )
        return self


class ReplicasConfig(_Section):
    """`[replicas]`: several gateways on one Postgres store (Kubernetes). Each replica serves the
    whole public API; a call that needs a supervisor session held by another replica is forwarded
    to it, over gRPC, with a credential the replicas share."""

    # Unique per replica and stable over its life (the pod name); "" = hostname-pid.
    id: str = ""
    # host:port at which the other replicas reach this one's gRPC (the pod IP and the gRPC port);
    # "" = listen_tcp as bound (loopback tests), which only works when that is reachable.
    address: str = ""
    # The shared replica-to-replica credential; "" = <state_dir>/replica-token (created 0600).
    # Every replica on a store must read the same one (a Secret on Kubernetes).
    token_file: str = ""
    # How often a replica says it is alive in the store; one silent for 3 of these is presumed
    # dead, and the sessions it held are marked disconnected (their supervisors reconnect).
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    # On SIGTERM a replica keeps serving this long, reporting NotServing on /healthz, so it leaves
    # the Service's endpoints while its clients move away: every client connection is closed
    # gracefully (GOAWAY, streams kept) once it is half this old, so none is left when it stops.
    # Keep it below the pod's termination grace period minus a few seconds for the stop itself.
    drain_seconds: float = Field(default=10.0, ge=0)


class GatewayConfig(_Section):
    """Everything `warmshell gateway start` needs."""

    state_dir: Path = Field(default_factory=default_state_dir)
    # True only where the state dir is a volume no one but this gateway's pod mounts (a Kubernetes
    # emptyDir is 0777 and a PVC root-owned by design): its mode and owner are then not checked.
    state_dir_private_volume: bool = False
    listen_tcp: str = ""  # "host:port"; the Unix socket is always served
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=9464, ge=0, le=65535)  # 0 = pick a free port
    driver: Literal["local", "kubernetes"] = "local"
    sandbox_token_ttl_seconds: int = Field(default=3600, ge=60)
    orphan_grace_seconds: float = Field(default=30.0, ge=0)
    reconcile_interval_seconds: float = Field(default=10.0, gt=0)
    heartbeat_interval_seconds: float = Field(default=5.0, gt=0)
    # A sandbox not Ready this long after its request (cold) or its claim (warm) goes Error with
    # the step it was stuck in, and its backend is removed: a create never waits forever.
    provisioning_deadline_seconds: float = Field(default=120.0, gt=0)
    warm_activation_deadline_seconds: float = Field(default=20.0, gt=0)
    max_request_bytes: int = Field(default=1024 * 1024, ge=4096)
    # Exec output flow control: at most this much of one exec's output is in flight between
    # its sandbox and its client; a client that reads nothing for the stall timeout ends the exec
    # with an error (the command is killed) instead of the gateway buffering without bound.
    exec_output_window_bytes: int = Field(default=DEFAULT_EXEC_WINDOW_BYTES, ge=64 * 1024, le=2**31)
    exec_stall_timeout_seconds: float = Field(default=60.0, gt=0)
    # A background command's output waits for a client in a ring of this many bytes (the oldest
    # dropped, and counted, past it). At most 16 running and 16 exited commands per sandbox keep
    # one, so a sandbox holds at most 32 rings (16 MiB at the default).
    exec_history_bytes: int = Field(default=DEFAULT_EXEC_HISTORY_BYTES, ge=4096, le=64 * 1024 * 1024)
    # On a stop (SIGTERM) the execs in flight get this long to finish while new calls are refused
    # (UNAVAILABLE "gateway stopping"); one still running then ends UNAVAILABLE, so a client
    # retries it as it would after a crash. With replicas this comes after `replicas.drain_seconds`.
    exec_drain_seconds: float = Field(default=10.0, ge=0)
    # Per listening server (public; supervisor.sock): past it a new connection is closed at accept.
    max_connections: int = Field(default=4096, ge=16)
    # A connection that has not completed its HTTP/2 handshake (client preface and SETTINGS) this
    # long is closed, so connections opened and left silent hold an accept slot this long at
    # most (gRPC's own default is 120 s); one with no call in flight for `connection_idle_seconds`
    # is told to go away (GOAWAY: a gRPC client reconnects on its next call). 0 = never.
    handshake_timeout_seconds: float = Field(default=10.0, gt=0)
    connection_idle_seconds: float = Field(default=300.0, ge=0)
    rate_limits: RateLimitsConfig = Field(default_factory=RateLimitsConfig)
    files: FilesConfig = Field(default_factory=FilesConfig)
    log_level: str = "INFO"
    # Allocations between young-generation collections of the gateway's Python collector. The
    # interpreter's 700 measured best for the tail: larger values make rarer but longer pauses
    # (bench/HISTORY.md, "Where a warm create's gateway CPU goes").
    gc_young_threshold: int = Field(default=700, ge=1)
    # The collector's full passes (every tracked object; 33-80 ms with 1,000 idle members) run at
    # the first moment with no create in flight once this many seconds have passed since the last,
    # and after `gc_full_overdue_seconds` whatever is in flight (gateway/collector.py).
    gc_full_interval_seconds: float = Field(default=30.0, gt=0)
    gc_full_overdue_seconds: float = Field(default=120.0, gt=0)
    # AES-256-GCM key sealing sandbox secrets in the store; "" = <state_dir>/secrets.key (created
    # 0600 on first start). Gateways sharing a store must share it: on Kubernetes, mount the
    # per-deployment Secret's key file here.
    secrets_key_file: str = ""
    lifetimes: LifetimesConfig = Field(default_factory=LifetimesConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    local: LocalDriverConfig = Field(default_factory=LocalDriverConfig)
    kubernetes: KubernetesDriverConfig = Field(default_factory=KubernetesDriverConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    replicas: ReplicasConfig = Field(default_factory=ReplicasConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)

    @property
    def paths(self) -> StatePaths:
        """The well-known files under `state_dir`."""
        return StatePaths(self.state_dir)


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Read a TOML file (if given) and apply overrides (None values are ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise InvalidArgumentError(str(path), f"cannot read the config file: {reason}") from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgumentError(str(path), f"not valid TOML: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        # A validator's own sentence is the rule; pydantic's "Value error, " prefix adds nothing.
        rule = first["msg"].removeprefix("Value error, ")
        raise InvalidArgumentError(f"{path or 'config'}: {where}", rule) from exc
