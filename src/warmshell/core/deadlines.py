"""Provisioning deadlines: a sandbox that is not Ready in time goes Error, with a reason naming
the step it was stuck in, so `sandbox create` always returns (pure functions over the record).

A cold sandbox gets `cold_seconds` from its request; one a warm member took gets `warm_seconds`
from its claim (the member was booted and registered already: only activation and the session
are left, so a stalled member is found out quickly).
"""

from __future__ import annotations

from dataclasses import dataclass

from warmshell.core.models import Allocation, Condition, Phase, SandboxRecord, SandboxStatus

__all__ = ["REASON", "ProvisioningDeadlines", "mark_timed_out", "overdue"]

REASON = "ProvisioningTimeout"


@dataclass(frozen=True)
class ProvisioningDeadlines:
    """How long a sandbox may stay Provisioning (seconds)."""

    cold_seconds: float = 120.0
    warm_seconds: float = 20.0


def _stuck_step(status: SandboxStatus) -> str:
    timeline = status.timeline
    if status.backend_state in ("", "Pending"):
        return "starting the sandbox (the backend never reported it running)"
    if not timeline.registered_us and not timeline.activated_us:
        return "waiting for its supervisor to register"
    if not timeline.activated_us:
        return "activating its supervisor"
    return "waiting for its supervisor's session (SupervisorNotConnected)"


def overdue(record: SandboxRecord, now_us: int, deadlines: ProvisioningDeadlines) -> str | None:
    """The Error message for a Provisioning sandbox past its deadline, else None."""
    status = record.status
    if status.phase != Phase.PROVISIONING:
        return None
    timeline = status.timeline
    if timeline.ready_us:
        # It was Ready: it is back in Provisioning only while its supervisor reconnects (a
        # gateway replica went away, or a restart), which is no provisioning to time out.
        return None
    started = timeline.requested_us or record.created_at_ms * 1000
    limit = deadlines.cold_seconds
    if status.allocation == Allocation.WARM and timeline.claimed_us:
        started, limit = timeline.claimed_us, deadlines.warm_seconds
    if now_us - started < limit * 1_000_000:
        return None
    path = "warm" if status.allocation == Allocation.WARM else "cold"
    return f"not Ready within {limit:g}s ({path}); stuck {_stuck_step(status)}"


def mark_timed_out(status: SandboxStatus, message: str) -> bool:
    """Make a still-Provisioning sandbox a sticky Error; False when it got out of Provisioning
    meanwhile (nothing changed)."""
    if status.phase != Phase.PROVISIONING:
        return False
    status.set_condition(Condition(type="Ready", status="False", reason=REASON, message=message))
    status.phase = Phase.ERROR
    return True
