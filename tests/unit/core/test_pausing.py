"""A pause and a resume as the record sees them (`core.pausing`), and the phase they compose to."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import pausing, phases
from warmshell.core.errors import FailedPreconditionError
from warmshell.core.models import Condition, Lifetime, Phase, SandboxRecord

IMAGE = "sha256:" + "a" * 64


def _ready(expires_at_ms: int = 0, idle: int = 0) -> SandboxRecord:
    record = SandboxRecord(
        id="sb-1",
        name="n",
        workspace="default",
        lifetime=Lifetime(ttl_seconds=600, expires_at_ms=expires_at_ms, idle_timeout_seconds=idle),
        activation_proof_hash="old",
    )
    record.status.phase = Phase.READY
    record.status.backend_state = phases.BACKEND_RUNNING
    record.status.supervisor_connected = True
    return record


def test_a_paused_sandbox_is_paused_whatever_its_backend_says_until_resumed() -> None:
    record = _ready(expires_at_ms=10_000, idle=30)
    pausing.mark_paused(record, IMAGE, now_ms=4_000, pause_ttl_seconds=60)
    assert phases.compose_phase(record.status) == Phase.PAUSED
    phases.mark_backend_vanished(record.status, "the backend removed the sandbox")
    phases.mark_session(record.status, False)
    assert record.status.phase == Phase.PAUSED
    assert (record.lifetime.expires_at_ms, record.lifetime.idle_timeout_seconds) == (64_000, 0)
    assert pausing.mark_resuming(record, "new", now_ms=100_000) == IMAGE
    assert record.status.phase == Phase.PROVISIONING
    assert record.activation_proof_hash == "new"
    # What was left of its TTL (6 s) counts again from the resume; its idle timeout is back.
    assert (record.lifetime.expires_at_ms, record.lifetime.idle_timeout_seconds) == (106_000, 30)
    assert phases.compose_phase(record.status) == Phase.PROVISIONING


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=10**6))
def test_a_sandbox_without_a_ttl_keeps_none_and_a_zero_pause_ttl_never_expires(now: int, pause: int) -> None:
    record = _ready()
    pausing.mark_paused(record, IMAGE, now_ms=now, pause_ttl_seconds=pause)
    assert record.lifetime.expires_at_ms == (now + pause * 1000 if pause else 0)
    pausing.mark_resuming(record, "p", now_ms=now + 5)
    assert record.lifetime.expires_at_ms == 0


def test_a_pause_retires_the_running_instance_and_a_resume_of_a_record_no_longer_paused_is_refused() -> None:
    record = _ready()
    record.status.instance_id = "pod-uid-1"
    record.status.connected_incarnation = record.status.activated_incarnation = 2
    pausing.mark_paused(record, pausing.SUSPENDED, now_ms=1, pause_ttl_seconds=0)
    assert record.status.instance_id == ""
    assert (record.status.activated_incarnation, record.status.connected_incarnation) == (-1, -1)
    assert pausing.is_retired(record.status, "pod-uid-1")
    assert not pausing.is_retired(record.status, "pod-uid-2")
    assert not pausing.is_retired(record.status, "")
    assert "suspended backend" in (record.status.condition("Ready") or Condition(type="x")).message
    phases.mark_deleting(record.status)
    with pytest.raises(FailedPreconditionError, match="only a Paused sandbox can be resumed"):
        pausing.mark_resuming(record, "p", now_ms=2)


@given(st.lists(st.text(alphabet="abcdef0123456789", min_size=1, max_size=8), min_size=1, max_size=80))
def test_the_retired_instances_are_bounded_and_keep_the_latest(instances: list[str]) -> None:
    record = _ready()
    for at, instance in enumerate(instances):
        record.status.phase = Phase.READY
        record.status.instance_id = instance
        pausing.mark_paused(record, IMAGE, now_ms=at, pause_ttl_seconds=0)
    assert record.status.retired_instances == instances[-pausing.RETIRED_KEPT :]
    assert pausing.is_retired(record.status, instances[-1])


def test_an_empty_retired_list_is_left_out_of_the_stored_record() -> None:
    record = _ready()
    assert "retired_instances" not in record.status.model_dump()
    record.status.retired_instances = ["x"]
    assert record.status.model_dump()["retired_instances"] == ["x"]
