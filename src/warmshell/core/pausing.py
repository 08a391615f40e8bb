"""A sandbox paused and resumed, as its record sees it (pure).

Paused: its files are an image (`status.paused_image`), nothing of it runs, and its own lifetime
stands still: what was left of its TTL and its idle timeout are kept aside, and the record expires
`pause_ttl_seconds` after the pause instead (a paused sandbox never resumed does not stay
forever). Resumed: the kept lifetime counts again from the resume, and the record is Provisioning
until the new backend's supervisor connects, as for a create.

A driver that pauses in place (`drivers.base.Suspender`: Kubernetes' `Suspended` mode) keeps the
files itself: its record says `SUSPENDED` where the image would be. Either way the paused
instance is retired: a resumed sandbox runs a new instance, and a sandbox token minted for a
retired one never opens a session again (`is_retired`), even before its expiry.
"""

from __future__ import annotations

from warmshell.core.errors import FailedPreconditionError
from warmshell.core.models import Condition, Phase, SandboxRecord, SandboxStatus

__all__ = ["RETIRED_KEPT", "SUSPENDED", "is_retired", "mark_paused", "mark_resuming"]

# What a paused record holds instead of an image when its driver keeps the sandbox suspended.
SUSPENDED = "suspended"
# Instances retired by pauses, newest last. Their tokens expire within the gateway's sandbox token
# TTL (an hour by default); a sandbox paused more than this many times within one TTL could let
# the oldest one's unexpired token back in, so the bound is kept well above the pause rate of a
# person or a harness (one pause a minute for half an hour).
RETIRED_KEPT = 32


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
    if status.instance_id:
        status.retired_instances = [*status.retired_instances, status.instance_id][-RETIRED_KEPT:]
    status.instance_id = ""
    status.activated_incarnation = status.connected_incarnation = -1
    status.phase = Phase.PAUSED
    kept = "its files are kept by its suspended backend" if image == SUSPENDED else f"its files are {image}"
    status.set_condition(Condition(type="Ready", status="False", reason="Paused", message=kept))


def is_retired(status: SandboxStatus, instance_id: str) -> bool:
    """`instance_id` ran this sandbox before a pause (its credentials are void)."""
    return bool(instance_id) and instance_id in status.retired_instances


def mark_resuming(record: SandboxRecord, proof_hash: str, *, now_ms: int) -> str:
    """`record` is started again (Provisioning, a new activation proof); the image it resumes from.
    FailedPreconditionError when it is no longer Paused (a delete came first)."""
    status, lifetime = record.status, record.lifetime
    if status.phase != Phase.PAUSED:
        raise FailedPreconditionError(
            f"sandbox {record.workspace}/{record.name} is {status.phase.value}: only a Paused sandbox can be resumed"
        )
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
