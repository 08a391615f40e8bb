"""A sandbox paused and resumed, as its record sees it (pure).

Paused: its files are an image (`status.paused_image`), nothing of it runs, and its own lifetime
stands still: what was left of its TTL and its idle timeout are kept aside, and the record expires
`pause_ttl_seconds` after the pause instead (a paused sandbox never resumed does not stay
forever). Resumed: the kept lifetime counts again from the resume, and the record is Provisioning
until the new backend's supervisor connects, as for a create.
"""

from __future__ import annotations

from warmshell.core.models import Condition, Phase, SandboxRecord

__all__ = ["mark_paused", "mark_resuming"]


def mark_paused(record: SandboxRecord, image: str, *, now_ms: int, pause_ttl_seconds: int) -> None:
    """`record` is paused into `image` at `now_ms`; it expires `pause_ttl_seconds` later (0: never)."""
    status, lifetime = record.status, record.lifetime
    status.paused_image = image
    status.paused_ttl_left_ms = max(lifetime.expires_at_ms - now_ms, 1) if lifetime.expires_at_ms else 0
    status.paused_idle_timeout_seconds = lifetime.idle_timeout_seconds
    lifetime.expires_at_ms = now_ms + pause_ttl_seconds * 1000 if pause_ttl_seconds else 0
    lifetime.idle_timeout_seconds = 0
    status.supervisor_connected = False
    status.session_id = status.session_owner = ""
    status.phase = Phase.PAUSED
    status.set_condition(Condition(type="Ready", status="False", reason="Paused", message=f"its files are {image}"))


def mark_resuming(record: SandboxRecord, proof_hash: str, *, now_ms: int) -> str:
    """`record` is started again (Provisioning, a new activation proof); the image it resumes from."""
    status, lifetime = record.status, record.lifetime
    image = status.paused_image
    lifetime.expires_at_ms = now_ms + status.paused_ttl_left_ms if status.paused_ttl_left_ms else 0
    lifetime.idle_timeout_seconds = status.paused_idle_timeout_seconds
    lifetime.last_activity_ms = now_ms
    status.paused_image = ""
    status.paused_ttl_left_ms = status.paused_idle_timeout_seconds = 0
    status.backend_state = ""
    status.supervisor_connected = False
    status.phase = Phase.PROVISIONING
    status.set_condition(Condition(type="Ready", status="False", reason="Resuming", message=f"from {image}"))
    record.activation_proof_hash = proof_hash
    return image
