"""Phase composition: Ready needs backend and session; Error is sticky."""

from __future__ import annotations

from warmshell.core import phases
from warmshell.core.models import Phase, SandboxStatus


def test_ready_needs_running_backend_and_live_session() -> None:
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    assert status.phase == Phase.PROVISIONING
    ready = status.condition("Ready")
    assert ready is not None
    assert ready.reason == "SupervisorNotConnected"
    phases.mark_session(status, True)
    assert status.phase == Phase.READY
    phases.mark_session(status, False)
    assert status.phase == Phase.PROVISIONING


def test_a_new_session_shows_even_when_the_old_one_was_never_seen_gone() -> None:
    """A restarted supervisor may open its session before the gateway noticed the old stream end:
    the condition stays True, but names the new session, with a new transition time."""
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    phases.mark_session(status, True, "s1")
    first = status.condition("SupervisorConnected")
    assert first is not None
    assert first.message == "session s1"
    first.last_transition_ms -= 1000  # as if a second had passed
    phases.mark_session(status, True, "s2")
    second = status.condition("SupervisorConnected")
    assert second is not None
    assert (second.status, second.message) == ("True", "session s2")
    assert second.last_transition_ms > first.last_transition_ms
    phases.mark_session(status, False)
    gone = status.condition("SupervisorConnected")
    assert gone is not None
    assert (gone.status, gone.message) == ("False", "")


def test_workload_exit_is_terminal_and_sticky() -> None:
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    phases.mark_session(status, True)
    phases.mark_workload_exit(status, 0)
    assert status.phase == Phase.EXITED  # finished, not failed
    assert status.exit_code == 0
    exited = status.condition("WorkloadExited")
    assert exited is not None
    assert exited.reason == "Completed"
    phases.mark_session(status, True)
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    assert status.phase == Phase.EXITED
    phases.mark_backend(status, phases.BACKEND_EXITED)
    phases.mark_backend_vanished(status, "gone")  # the pod went after it completed
    assert status.phase == Phase.EXITED
    assert status.condition("Ready") is not None
    assert status.condition("Ready").reason == "WorkloadExited"  # type: ignore[union-attr]


def test_a_failing_workload_exits_rather_than_errors() -> None:
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    phases.mark_workload_exit(status, 3)
    assert (status.phase, status.exit_code) == (Phase.EXITED, 3)
    failed = status.condition("WorkloadExited")
    assert failed is not None
    assert failed.reason == "Failed"


def test_a_backend_that_exits_without_a_workload_exit_is_an_error() -> None:
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    phases.mark_backend(status, phases.BACKEND_EXITED)
    assert status.phase == Phase.ERROR
    assert status.exit_code is None


def test_backend_failure_and_vanishing() -> None:
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_FAILED, message="bwrap: no permission")
    assert status.phase == Phase.ERROR
    ready = status.condition("Ready")
    assert ready is not None
    assert ready.message == "bwrap: no permission"
    other = SandboxStatus()
    phases.mark_backend_vanished(other, "gone")
    assert other.phase == Phase.ERROR


def test_deleting_is_sticky() -> None:
    status = SandboxStatus()
    phases.mark_deleting(status)
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    phases.mark_session(status, True)
    assert status.phase == Phase.DELETING


def test_an_exec_refusal_says_reconnecting_for_a_sandbox_that_was_ready() -> None:
    status = SandboxStatus()
    phases.mark_backend(status, phases.BACKEND_RUNNING)
    never = phases.not_servable("default/box", status, operation="exec")
    assert str(never) == "sandbox default/box is Provisioning; exec needs Ready"
    phases.mark_session(status, True)
    status.timeline.ready_us = 1
    # Ready in the record, but no session here (it just dropped, or another replica holds it):
    # never "is Ready; exec needs Ready".
    live_record = phases.not_servable("default/box", status, operation="exec")
    assert "is Ready" not in str(live_record)
    assert str(live_record) == (
        "sandbox default/box has no live supervisor session at the moment (its supervisor is reconnecting); "
        "retry the exec in a few seconds"
    )
    phases.mark_session(status, False)  # Provisioning again while it reconnects
    assert status.phase == Phase.PROVISIONING
    assert str(phases.not_servable("default/box", status, operation="file operation")).endswith(
        "(its supervisor is reconnecting); retry the file operation in a few seconds"
    )
    phases.mark_workload_exit(status, 0)
    assert str(phases.not_servable("default/box", status, operation="exec")) == (
        "sandbox default/box is Exited; exec needs Ready"
    )
