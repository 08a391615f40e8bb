"""Phase composition: the public phase follows from the backend's state, the supervisor session
and the workload's exit, with conditions that say why. Pure functions over SandboxStatus.

PROVISIONING -> READY needs the backend running AND a live supervisor session. A workload exit
makes the sandbox EXITED (with its exit code), a broken backend makes it ERROR. EXITED, ERROR and
DELETING are sticky: nothing the backend later says brings a sandbox back.
"""

from __future__ import annotations

from warmshell.core.errors import FailedPreconditionError
from warmshell.core.models import Condition, Phase, SandboxStatus, now_ms

__all__ = [
    "BACKEND_EXITED",
    "BACKEND_FAILED",
    "BACKEND_RUNNING",
    "compose_phase",
    "mark_backend",
    "mark_backend_vanished",
    "mark_deleting",
    "mark_expired",
    "mark_session",
    "mark_workload_exit",
    "not_servable",
]

# The driver's BackendState values, as stored (core must not import drivers).
BACKEND_PENDING = "Pending"
BACKEND_RUNNING = "Running"
BACKEND_EXITED = "Exited"
BACKEND_FAILED = "Failed"

TERMINAL = frozenset({Phase.EXITED, Phase.ERROR, Phase.DELETING})


def settled(status: SandboxStatus) -> bool:
    """Whether a create waiting for Ready is done waiting: Ready, or it never will be."""
    return status.phase == Phase.READY or status.phase in TERMINAL


def compose_phase(status: SandboxStatus) -> Phase:
    """The phase the inputs in `status` imply (sticky phases stay)."""
    if status.phase in TERMINAL:
        return status.phase
    if status.paused_image:
        return Phase.PAUSED
    if status.exit_code is not None:
        return Phase.EXITED
    if status.backend_state in (BACKEND_EXITED, BACKEND_FAILED):
        return Phase.ERROR
    if status.backend_state == BACKEND_RUNNING and status.supervisor_connected:
        return Phase.READY
    return Phase.PROVISIONING


def _settle(status: SandboxStatus) -> None:
    phase = compose_phase(status)
    if phase == Phase.READY:
        status.set_condition(Condition(type="Ready", status="True", reason="SupervisorConnected"))
    elif phase == Phase.PROVISIONING:
        reason = "SupervisorNotConnected" if status.backend_state == BACKEND_RUNNING else "BackendNotRunning"
        status.set_condition(Condition(type="Ready", status="False", reason=reason))
    elif phase == Phase.ERROR and status.phase != Phase.ERROR:
        ready = status.condition("Ready")
        if ready is None or ready.status != "False":  # keep the specific reason a mark_* set
            status.set_condition(Condition(type="Ready", status="False", reason="Error"))
    status.phase = phase


def mark_backend(status: SandboxStatus, state: str, *, message: str = "") -> None:
    """Record the backend's state; a failure becomes a sticky Error with the backend's message."""
    status.backend_state = state
    status.backend_seen_ms = now_ms()
    if state == BACKEND_FAILED and status.phase not in TERMINAL:
        status.set_condition(Condition(type="Ready", status="False", reason="BackendFailed", message=message))
    elif state == BACKEND_EXITED and status.phase not in TERMINAL and status.exit_code is None:
        status.set_condition(
            Condition(
                type="Ready",
                status="False",
                reason="BackendExited",
                message=message or "the sandbox exited",
            )
        )
    _settle(status)


def mark_session(status: SandboxStatus, connected: bool, session_id: str = "") -> None:
    """Record whether a supervisor session is live. The live session is named in the message: a
    supervisor that restarted, or reconnected before its old stream was noticed gone, shows as a
    new session even where the condition's status never went False."""
    status.supervisor_connected = connected
    status.set_condition(
        Condition(
            type="SupervisorConnected",
            status="True" if connected else "False",
            reason="SessionLive" if connected else "SupervisorNotConnected",
            message=f"session {session_id}" if connected and session_id else "",
        )
    )
    _settle(status)


def mark_workload_exit(status: SandboxStatus, exit_code: int) -> None:
    """The workload ended: terminal (Exited, with its code), visible, never silently Ready."""
    if status.exit_code is None:
        status.exit_code = exit_code
    reason = "Completed" if exit_code == 0 else "Failed"
    status.set_condition(
        Condition(type="WorkloadExited", status="True", reason=reason, message=f"exit code {exit_code}")
    )
    if status.phase not in TERMINAL:
        status.set_condition(
            Condition(
                type="Ready",
                status="False",
                reason="WorkloadExited",
                message=f"exit code {exit_code}",
            )
        )
    _settle(status)


def mark_backend_vanished(status: SandboxStatus, message: str) -> None:
    """The backend no longer has this sandbox (and it was not being deleted, nor paused)."""
    if status.phase in TERMINAL or status.paused_image:
        return
    status.set_condition(Condition(type="Ready", status="False", reason="BackendVanished", message=message))
    status.phase = Phase.ERROR


def mark_expired(status: SandboxStatus, reason: str, message: str) -> None:
    """The sandbox's lifetime ended (`reason` TtlExpired, IdleTimeout or ExitedRetention); it is
    deleted next, and the condition tells its watchers why."""
    status.set_condition(Condition(type="Expired", status="True", reason=reason, message=message))


def mark_deleting(status: SandboxStatus) -> None:
    """Deletion has been requested."""
    status.phase = Phase.DELETING
    status.set_condition(Condition(type="Ready", status="False", reason="Deleting"))


def not_servable(where: str, status: SandboxStatus, *, operation: str) -> FailedPreconditionError:
    """Why `operation` ("exec", "files") cannot be served for the sandbox `where` now: it is not
    Ready, or this gateway holds no live session for it.

    A sandbox that was Ready and lost its session (a gateway restart, missed heartbeats, a replica
    that cannot reach the session's holder) is in no wrong state for the caller to fix: its
    supervisor reconnects on its own, so the message says so, and that a retry will do.
    """
    was_ready = status.timeline.ready_us != 0
    if status.phase == Phase.READY or (status.phase == Phase.PROVISIONING and was_ready):
        return FailedPreconditionError(
            f"sandbox {where} has no live supervisor session at the moment (its supervisor is "
            f"reconnecting); retry the {operation} in a few seconds"
        )
    return FailedPreconditionError(f"sandbox {where} is {status.phase.value}; {operation} needs Ready")
