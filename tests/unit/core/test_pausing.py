"""A pause and a resume as the record sees them (`core.pausing`), and the phase they compose to."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import pausing, phases
from warmshell.core.models import Lifetime, Phase, SandboxRecord

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
