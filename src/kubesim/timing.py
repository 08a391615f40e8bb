"""Timing knobs for kubesim's controllers and kubelet.

A real cluster is slow in specific places (API round trips, controller queueing, scheduling, container
start); warmshell's benchmarks and timeouts must be exercised against those delays, while tests want
them near zero. ``DEFAULT`` follows the agent-sandbox measurements (notes §14 and §17 G); ``FAST``
keeps every behaviour but collapses the waits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """Delays in seconds. Zero means "as fast as the event loop allows"."""

    #: Added to every API request by the API server's latency fault injection.
    api_latency: float = 0.005
    #: Between a watch event and the reconcile it triggers (workqueue + informer lag).
    reconcile_delay: float = 0.005
    #: Pod created → bound to a node (upstream: tens of ms, ~70 pods/s).
    scheduling_delay: float = 0.015
    #: Pod bound → container process started and pod Running (cached image, runc: ~2.5-3.5 s).
    container_start_delay: float = 2.5
    #: Pods a simulated node starts at once (0: unbounded). Each start is a real process start here,
    #: so a pool filled from nothing must not start hundreds together (a real kubelet serialises
    #: image pulls, ``maxParallelImagePulls``). See ``kubesim.kubelet.startslots``.
    max_parallel_pod_starts: int = 4
    #: A pod gives its start slot back after this long even if it is not Ready.
    pod_start_timeout: float = 10.0
    #: Container running → pod Ready when there is no readiness probe.
    readiness_delay: float = 0.1
    #: A pod's status changes within this long of the first are reported in one patch (the real
    #: kubelet learns of container transitions from a periodic relist, so the starts of a pod's
    #: containers arrive as one status update, not one per container).
    status_batch_window: float = 0.025
    #: Period of readiness probes when a pod has none of its own settings.
    probe_period: float = 1.0
    #: Back-off before restarting an exited container (kubelet: 10 s doubling; we keep it flat).
    restart_backoff: float = 1.0
    #: How long a claim waits for warm candidates without pod IPs before going cold.
    warm_candidate_grace: float = 2.0
    #: Retry period inside that grace.
    warm_candidate_retry: float = 0.5
    #: Requeue when a claim's pool or template is missing (also woken by watch events).
    missing_ref_requeue: float = 60.0
    #: Floor of the requeue before a Sandbox's shutdownTime.
    expiry_requeue_floor: float = 2.0
    #: A warm Sandbox not Ready for this long is replaced.
    pool_readiness_grace: float = 300.0
    #: Expectations for unobserved creates/deletes expire after this (then the pool acts anyway).
    pool_expectations_timeout: float = 300.0
    #: Pool reconciles wait this long so a burst of member events becomes one reconcile (upstream
    #: runs one pool worker behind a rate-limited queue, which batches the same way).
    pool_batch_window: float = 0.005
    #: Watch timeoutSeconds asked of the API server (re-watch afterwards).
    watch_timeout: int = 290


DEFAULT = Timing()

FAST = Timing(
    api_latency=0.0,
    reconcile_delay=0.0,
    scheduling_delay=0.0,
    container_start_delay=0.0,
    max_parallel_pod_starts=8,
    pod_start_timeout=2.0,
    readiness_delay=0.0,
    status_batch_window=0.0,
    probe_period=0.05,
    restart_backoff=0.05,
    warm_candidate_grace=0.2,
    warm_candidate_retry=0.05,
    missing_ref_requeue=1.0,
    expiry_requeue_floor=0.05,
    pool_readiness_grace=300.0,
    pool_expectations_timeout=10.0,
    watch_timeout=60,
)

PROFILES: dict[str, Timing] = {"default": DEFAULT, "fast": FAST}


def profile(name: str, environ: Mapping[str, str] | None = None) -> Timing:
    """Return a named profile (``default`` or ``fast``); ``KUBESIM_MAX_PARALLEL_POD_STARTS`` in
    ``environ`` (when given) overrides its pod start bound."""
    try:
        chosen = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown timing profile {name!r}; choose from {sorted(PROFILES)}") from None
    raw = (environ or {}).get("KUBESIM_MAX_PARALLEL_POD_STARTS")
    if raw is None:
        return chosen
    try:
        starts = int(raw)
        if starts < 0:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"KUBESIM_MAX_PARALLEL_POD_STARTS must be an integer >= 0 (0 = unbounded), got {raw!r}"
        ) from None
    return dataclasses.replace(chosen, max_parallel_pod_starts=starts)
