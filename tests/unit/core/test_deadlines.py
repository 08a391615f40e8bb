"""Provisioning deadlines: which sandboxes are overdue, and the step each was stuck in."""

from __future__ import annotations

from warmshell.core.deadlines import ProvisioningDeadlines, mark_timed_out, overdue
from warmshell.core.models import Allocation, Phase, SandboxRecord

DEADLINES = ProvisioningDeadlines(cold_seconds=120, warm_seconds=10)
S = 1_000_000


def record(**status: object) -> SandboxRecord:
    made = SandboxRecord(id="sb-1", name="a", workspace="default")
    made.status.timeline.requested_us = 1000 * S
    for key, value in status.items():
        setattr(made.status, key, value)
    return made


def test_a_cold_sandbox_has_its_deadline_from_the_request() -> None:
    stuck = record(backend_state="Pending")
    assert overdue(stuck, 1119 * S, DEADLINES) is None
    message = overdue(stuck, 1120 * S, DEADLINES)
    assert message == "not Ready within 120s (cold); stuck starting the sandbox (the backend never reported it running)"


def test_a_warm_sandbox_has_the_short_deadline_from_its_claim() -> None:
    stuck = record(backend_state="Running", allocation=Allocation.WARM)
    stuck.status.timeline.claimed_us = 1100 * S
    stuck.status.timeline.registered_us = 1050 * S
    assert overdue(stuck, 1109 * S, DEADLINES) is None
    assert overdue(stuck, 1110 * S, DEADLINES) == "not Ready within 10s (warm); stuck activating its supervisor"
    stuck.status.timeline.activated_us = 1101 * S
    assert "stuck waiting for its supervisor's session" in (overdue(stuck, 1110 * S, DEADLINES) or "")


def test_only_provisioning_sandboxes_time_out() -> None:
    for phase in (Phase.READY, Phase.ERROR, Phase.DELETING):
        assert overdue(record(phase=phase), 10_000 * S, DEADLINES) is None
    ready = record(phase=Phase.READY)
    assert not mark_timed_out(ready.status, "late")
    assert ready.status.phase == Phase.READY
    stuck = record()
    assert mark_timed_out(stuck.status, "late")
    assert stuck.status.phase == Phase.ERROR


def test_a_sandbox_that_was_ready_and_lost_its_session_does_not_time_out() -> None:
    """Back in Provisioning only while its supervisor reconnects (its gateway replica died, or
    restarted): long past its claim's deadline, it is not a provisioning that failed."""
    waiting = record(backend_state="Running", allocation=Allocation.WARM)
    waiting.status.timeline.claimed_us = 1000 * S
    waiting.status.timeline.activated_us = 1001 * S
    waiting.status.timeline.ready_us = 1002 * S
    assert overdue(waiting, 5000 * S, DEADLINES) is None
