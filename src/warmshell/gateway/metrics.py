"""Prometheus metrics of the gateway (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "ACTIVATIONS",
    "CREATES",
    "CREATE_READY_SECONDS",
    "EGRESS_BYTES",
    "EGRESS_CONNECTIONS",
    "EGRESS_HANDOFFS",
    "EXECS",
    "GC_PAUSE_SECONDS",
    "POOL_MEMBERS",
    "RATE_LIMITED",
    "REGISTRATIONS_PENDING",
    "REGISTRY",
    "SANDBOXES",
    "SANDBOXES_EXPIRED",
    "SANDBOX_USAGE",
    "SANDBOX_USAGE_UNLISTED",
    "SESSIONS",
    "SETUP_BUILDS",
    "SETUP_BUILD_SECONDS",
]

REGISTRY = CollectorRegistry(auto_describe=True)

# Fine enough to resolve single milliseconds at the warm end, wide enough for cold Kubernetes.
_LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.012, 0.015, 0.020, 0.025, 0.030,
    0.040, 0.050, 0.075, 0.100, 0.150, 0.200, 0.300, 0.500, 0.750, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

CREATES = Counter(
    "warmshell_sandbox_creates",
    "Sandbox creates by allocation path (warm|cold) and pool miss reason",
    ["path", "reason"],
    registry=REGISTRY,
)
CREATE_READY_SECONDS = Histogram(
    "warmshell_sandbox_create_ready_seconds",
    "Time from CreateSandbox to Ready by path (warm|cold|refilled: warm after waiting for the pool to refill)",
    ["path"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
SANDBOXES = Gauge("warmshell_sandboxes", "Sandboxes by phase", ["phase"], registry=REGISTRY)
POOL_MEMBERS = Gauge(
    "warmshell_pool_members",
    "Warm pool members by pool and state (desired|ready|idle)",
    ["pool", "state"],
    registry=REGISTRY,
)
REGISTRATIONS_PENDING = Gauge(
    "warmshell_registrations_pending",
    "Supervisor registrations waiting for activation",
    registry=REGISTRY,
)
SESSIONS = Gauge("warmshell_supervisor_sessions", "Live supervisor sessions", registry=REGISTRY)
ACTIVATIONS = Counter("warmshell_activations", "Activation attempts by result", ["result"], registry=REGISTRY)
SANDBOXES_EXPIRED = Counter(
    "warmshell_sandboxes_expired", "Sandboxes deleted at the end of their lifetime", ["reason"], registry=REGISTRY
)
EXECS = Counter("warmshell_execs", "Exec requests by result", ["result"], registry=REGISTRY)
RATE_LIMITED = Counter(
    "warmshell_rate_limited",
    "Supervisor calls refused with RESOURCE_EXHAUSTED, by call (registration|token_refresh)",
    ["call"],
    registry=REGISTRY,
)
GC_PAUSE_SECONDS = Histogram(
    "warmshell_gc_pause_seconds",
    "Pauses of the gateway process for Python's cyclic garbage collector, by generation",
    ["generation"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
EGRESS_CONNECTIONS = Counter(
    "warmshell_egress_connections",
    "Connections through the egress proxy by verdict (allowed|denied|refused|malformed)",
    ["verdict"],
    registry=REGISTRY,
)
EGRESS_BYTES = Counter(
    "warmshell_egress_bytes", "Bytes through the egress proxy by direction (up|down)", ["direction"], registry=REGISTRY
)
EGRESS_HANDOFFS = Counter(
    "warmshell_egress_handoffs",
    "Sockets handed to the egress proxy by local sandboxes' agents, by result (accepted: a connection; "
    "listener: a listening socket the proxy then accepts on; or refused: refused_channel|not_socket|not_tcp|"
    "not_connected|not_listening|not_loopback|own_netns|unknown_netns|many_listeners|many_fds|no_fd|bad_record)",
    ["result"],
    registry=REGISTRY,
)

SETUP_BUILDS = Counter(
    "warmshell_setup_builds",
    "Builds of warm-pool profiles' [setup] images by profile and result (started|succeeded|failed) and the "
    "step that failed (1-based; empty when the build failed outside a step, or did not fail)",
    ["profile", "result", "step"],
    registry=REGISTRY,
)
SETUP_BUILD_SECONDS = Histogram(
    "warmshell_setup_build_seconds",
    "Duration of [setup] image builds by profile and result (succeeded|failed)",
    ["profile", "result"],
    buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0),
    registry=REGISTRY,
)

# One gauge per figure of `drivers.base.SandboxUsage`, for at most `metrics.per_sandbox_limit`
# sandboxes (gateway/usage.py says which and why).
_USAGE_HELP = {
    "cpu_seconds": "cpu time the sandbox has used",
    "memory_bytes": "Memory the sandbox uses now",
    "memory_peak_bytes": "The most memory the sandbox has used at once",
    "processes": "Processes and threads in the sandbox",
    "workspace_bytes": "Bytes in use on the sandbox's /workspace",
    "root_bytes": "Bytes written to the sandbox's writable root",
}
SANDBOX_USAGE = {
    figure: Gauge(f"warmshell_sandbox_{figure}", text, ["workspace", "name"], registry=REGISTRY)
    for figure, text in _USAGE_HELP.items()
}
SANDBOX_USAGE_UNLISTED = Gauge(
    "warmshell_sandbox_usage_unlisted",
    "Running sandboxes left out of the per-sandbox gauges by metrics.per_sandbox_limit",
    registry=REGISTRY,
)
