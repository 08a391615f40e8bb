"""Pure mapping of what the cluster says into driver types: a Sandbox and its pod become a
`DriverSandbox` (backend state plus conditions that say why), a pod or Sandbox Event becomes a
progress line for `warmshell sandbox create`.

The pod restarts a failed supervisor (`restartPolicy: OnFailure`, see rendering), so a Running pod
may hold a container that has crashed and is backing off: it stays Running (the supervisor comes
back, registers again and the gateway re-activates it) until it has been restarted RESTART_LIMIT
times, then it is Failed with its last exit. Of the pod's two containers, the one in trouble
speaks for it (an image that cannot be pulled, then the most restarts), else the supervisor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from warmshell.core.ids import SandboxId
from warmshell.drivers.base import BackendState, DriverCondition, DriverSandbox, MissReason, ProgressLine
from warmshell.drivers.kubernetes import labels
from warmshell.drivers.kubernetes.rendering import CONTAINER, WORKLOAD_CONTAINER

__all__ = [
    "RESTART_LIMIT",
    "is_managed",
    "is_suspended",
    "own_pod",
    "owned_pod_name",
    "pod_belongs_to",
    "progress_line",
    "sandbox_id_of",
    "view",
]

# Read-only here (callers pass Mappings): not the shared `objects.Obj`, which is a dict.
Obj = Mapping[str, Any]
P = TypeVar("P", bound=Mapping[str, Any])

# Waiting reasons after which the container will never start without someone changing the pod.
_FATAL_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})
_IMAGE_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# A supervisor container restarted this many times fails its sandbox, as a Job with restartPolicy
# OnFailure fails once its pods' restarts reach its backoffLimit: a crash (SIGKILL, OOM) is
# recovered in place, a supervisor that keeps failing (a broken image, a refused credential) is an
# Error rather than a CrashLoopBackOff that a create would wait on forever.
RESTART_LIMIT = 3


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def sandbox_id_of(obj: Obj) -> SandboxId | None:
    """The sandbox id label of one of our objects; None for anything not ours."""
    found = (_meta(obj).get("labels") or {}).get(labels.SANDBOX_ID)
    return SandboxId(found) if isinstance(found, str) and found else None


def is_managed(obj: Obj) -> bool:
    """Carries our managed-by label and a sandbox id (selectors already ask for this; we check
    again because a label selector is the server's promise, not ours)."""
    found = _meta(obj).get("labels") or {}
    return found.get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE and sandbox_id_of(obj) is not None


def owned_pod_name(sandbox: Obj) -> str:
    """The pod of a Sandbox: agent-sandbox's pod-name annotation, else the Sandbox's name."""
    meta = _meta(sandbox)
    return str((meta.get("annotations") or {}).get(labels.POD_NAME) or meta.get("name") or "")


def pod_belongs_to(pod: Obj, sandbox: Obj) -> bool:
    """The pod's controlling owner is this very Sandbox (by uid, not by name)."""
    uid = _meta(sandbox).get("uid")
    controllers = [r for r in _meta(pod).get("ownerReferences") or [] if r.get("controller")]
    return len(controllers) == 1 and controllers[0].get("kind") == "Sandbox" and controllers[0].get("uid") == uid


def own_pod(sandbox: Obj, pod: P | None) -> P | None:
    """The pod only if this Sandbox controls it (a stale pod of an earlier Sandbox of the same
    name is not this sandbox's)."""
    return pod if pod is not None and pod_belongs_to(pod, sandbox) else None


def view(sandbox: Obj, pod: Obj | None) -> DriverSandbox:
    """The driver's view of one of our Sandboxes and (if it has one yet) its pod."""
    sandbox_id = sandbox_id_of(sandbox)
    assert sandbox_id is not None, "view() is only for objects carrying our sandbox id"
    conditions = list(_sandbox_conditions(sandbox))
    state, message = BackendState.PENDING, ""
    instance_id = ""
    if pod is not None:
        instance_id = str(_meta(pod).get("uid") or "")
        pod_conditions, state, message = _pod_view(pod)
        conditions.extend(pod_conditions)
    elif (ready := _sandbox_ready(sandbox)) is not None and ready.get("reason") in ("PodFailed", "SandboxExpired"):
        state, message = BackendState.FAILED, str(ready.get("message", ""))
    return DriverSandbox(
        sandbox_id=sandbox_id,
        instance_id=instance_id,
        state=state,
        conditions=tuple(conditions),
        miss_reason=MissReason.DISABLED.value,
        message=message,
        suspended=is_suspended(sandbox),
    )


def is_suspended(sandbox: Obj) -> bool:
    """The Sandbox is asked to run nothing: agent-sandbox's `Suspended` operating mode (v1beta1),
    whatever its pod is still doing on the way out."""
    return (sandbox.get("spec") or {}).get("operatingMode") == SUSPENDED


SUSPENDED = "Suspended"


def _sandbox_ready(sandbox: Obj) -> Obj | None:
    conditions = (sandbox.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), None)


def _sandbox_conditions(sandbox: Obj) -> list[DriverCondition]:
    cond = _sandbox_ready(sandbox)
    if cond is None:
        return [DriverCondition("SandboxReady", "Unknown", "NotObserved", "agent-sandbox has not reported yet")]
    state = str(cond.get("status", "Unknown"))
    return [DriverCondition("SandboxReady", state, str(cond.get("reason", "")), str(cond.get("message", "")))]


def _pod_view(pod: Obj) -> tuple[list[DriverCondition], BackendState, str]:
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    conditions = [_scheduled(status)]
    container = _container_status(status)
    conditions.extend(_container_conditions(container))
    if _meta(pod).get("deletionTimestamp"):
        state = BackendState.PENDING if phase == "Pending" else BackendState.RUNNING
        return conditions, state, "the pod is terminating"
    if phase == "Running":
        restarts = _restart_count(container)
        if restarts >= RESTART_LIMIT:
            last = _terminated_message(container, last=True) or "the container kept failing"
            message = f"{last}; restarts: {restarts} (the limit is {RESTART_LIMIT})"
            # Whatever the kubelet is doing with it now (backing off, or one more run), it is done.
            given_up = DriverCondition("ContainerRunning", "False", "BackoffLimitExceeded", message)
            conditions = [c for c in conditions if c.type != given_up.type] + [given_up]
            return conditions, BackendState.FAILED, message
        return conditions, BackendState.RUNNING, ""
    if phase == "Succeeded":
        return conditions, BackendState.EXITED, _terminated_message(container) or "the pod completed"
    if phase == "Failed":
        message = _terminated_message(container) or status.get("message") or "the pod failed"
        return conditions, BackendState.FAILED, message
    waiting = ((container or {}).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in _FATAL_WAITING:
        return conditions, BackendState.FAILED, f"{waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")
    return conditions, BackendState.PENDING, ""


def _scheduled(status: Obj) -> DriverCondition:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            reason = cond.get("reason") or ("Scheduled" if cond.get("status") == "True" else "Pending")
            return DriverCondition("PodScheduled", str(cond.get("status", "Unknown")), reason, cond.get("message", ""))
    return DriverCondition("PodScheduled", "Unknown", "Pending", "waiting for the scheduler")


def _container_status(status: Obj) -> Obj | None:
    ours = [c for c in status.get("containerStatuses") or [] if c.get("name") in (CONTAINER, WORKLOAD_CONTAINER)]
    return max(ours, key=_trouble) if ours else None


def _trouble(container: Obj) -> tuple[bool, int, bool]:
    """How much a container says about its pod: one that cannot start, then the most restarts,
    then the supervisor."""
    reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
    stuck = reason in _FATAL_WAITING or reason in _IMAGE_WAITING
    return stuck, _restart_count(container), container.get("name") == CONTAINER


def _container_conditions(container: Obj | None) -> list[DriverCondition]:
    if container is None:
        return [
            DriverCondition("ImagePulled", "Unknown", "Pending", "not started yet"),
            DriverCondition("ContainerRunning", "False", "Pending", "not started yet"),
        ]
    state = container.get("state") or {}
    waiting = state.get("waiting")
    pulled = DriverCondition("ImagePulled", "True", "Pulled", str(container.get("image", "")))
    # After a restart, what the container last exited with (the kubelet's back-off says less).
    restarted = _terminated_message(container, last=True) if _restart_count(container) else ""
    if waiting is not None:
        reason, message = str(waiting.get("reason") or "Waiting"), str(waiting.get("message") or "")
        if reason in _IMAGE_WAITING:
            return [
                DriverCondition("ImagePulled", "False", reason, message),
                DriverCondition("ContainerRunning", "False", reason, message),
            ]
        if restarted or "terminated" in (container.get("lastState") or {}):
            # Backing off before a restart: the image was pulled for the run that ended.
            return [pulled, DriverCondition("ContainerRunning", "False", reason, message or restarted)]
        return [
            DriverCondition("ImagePulled", "Unknown", "Pulling", f"pulling {container.get('image', 'the image')}"),
            DriverCondition("ContainerRunning", "False", reason, message),
        ]
    if "running" in state:
        started = f"restarts: {_restart_count(container)}; before the last one, {restarted}" if restarted else ""
        return [pulled, DriverCondition("ContainerRunning", "True", "Started", started)]
    ended = DriverCondition("ContainerRunning", "False", _terminated_reason(container), _terminated_message(container))
    return [pulled, ended]


def _restart_count(container: Obj | None) -> int:
    count = (container or {}).get("restartCount")
    return count if isinstance(count, int) else 0


def _terminated_reason(container: Obj) -> str:
    terminated = (container.get("state") or {}).get("terminated") or {}
    return str(terminated.get("reason") or "Terminated")


def _terminated_message(container: Obj | None, *, last: bool = False) -> str:
    """How the container's current run ended; with `last`, else how its previous run did."""
    terminated = ((container or {}).get("state") or {}).get("terminated")
    if not terminated and last:
        terminated = ((container or {}).get("lastState") or {}).get("terminated")
    if not terminated:
        return ""
    name = (container or {}).get("name") or CONTAINER
    text = f"container {name} exited with code {terminated.get('exitCode')} ({terminated.get('reason', 'Error')})"
    if terminated.get("message"):
        text += f": {terminated['message']}"
    return text


def progress_line(event: Obj) -> ProgressLine:
    """A Kubernetes Event as a progress line ("Pulling: Pulling image ...")."""
    involved = event.get("involvedObject") or {}
    message = str(event.get("message") or event.get("note") or "")
    kind = involved.get("kind", "")
    return ProgressLine(
        reason=str(event.get("reason") or "Event"),
        message=f"{kind.lower()}: {message}" if kind else message,
        warning=event.get("type") == "Warning",
        seen_by_every_replica=True,  # every replica's informer watches the Events
    )
