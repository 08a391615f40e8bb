"""Warm or cold: the one decision every create makes, shared by the drivers.

A driver asks `decide` with the create's shape, its pool lookup (None when warm pooling is not
configured) and whether it can activate a warm member now; the answer is `Warm(pool)` — try that
pool — or `Cold(reason)`. A driver that tries a pool and finds it without an idle member turns
the `Warm` into `empty(pool)`. `Cold.charged` names the pools that count the miss, so both drivers
count misses the same way. Pure: the drivers do the I/O before (the lookup) and after (the claim).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from warmshell.core import matching
from warmshell.core.fingerprints import SandboxShape
from warmshell.core.models import Condition, SandboxStatus
from warmshell.core.states import Allocation

__all__ = [
    "REFILLED",
    "Cold",
    "Decision",
    "MissReason",
    "PoolLookup",
    "Warm",
    "decide",
    "empty",
    "mark_refilled",
    "refill_wait_us",
]

P = TypeVar("P")


class MissReason(StrEnum):
    """Why a create went cold; only an exact single match goes warm."""

    NOT_READY = "NotReady"  # the driver cannot serve warm yet: pools not synced, or nothing to activate with
    NO_MATCH = "NoMatch"
    AMBIGUOUS = "Ambiguous"  # several pools share the fingerprint; none is chosen
    EMPTY = "Empty"  # matched a pool that had no idle member
    DISABLED = "Disabled"  # warm pooling is not configured


class PoolLookup(Protocol[P]):
    """Where a driver keeps its pools (a `matching.PoolIndex`, or a cache answering from one)."""

    def match(self, shape: SandboxShape) -> matching.MatchResult[P]: ...


@dataclass(frozen=True)
class Warm(Generic[P]):
    """Serve the create from this pool; `injected` are the environment keys it accepts from the
    request (set at activation rather than matched)."""

    pool: P
    injected: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cold(Generic[P]):
    """Create cold; `charged` are the pools whose miss count this create raises."""

    reason: MissReason
    charged: tuple[P, ...] = ()


Decision = Warm[P] | Cold[P]


def decide(shape: SandboxShape, pools: PoolLookup[P] | None, *, ready: bool) -> Decision[P]:
    """Warm only for exactly one matching pool, with pooling configured (`pools`) and the driver
    able to activate (`ready`); the reasons are checked in that order."""
    if pools is None:
        return Cold(MissReason.DISABLED)
    if not ready:
        return Cold(MissReason.NOT_READY)
    found = pools.match(shape)
    if isinstance(found, matching.Match):
        return Warm(found.pool, found.injected)
    if isinstance(found, matching.Ambiguous):
        return Cold(MissReason.AMBIGUOUS, found.pools)
    if isinstance(found, matching.NoMatch):
        return Cold(MissReason.NO_MATCH)
    return Cold(MissReason.NOT_READY)


def empty(pool: P) -> Cold[P]:
    """The decision after a `Warm(pool)` found no member that would activate."""
    return Cold(MissReason.EMPTY, (pool,))


# The Allocated condition's reason for a warm create that waited for its pool to refill.
REFILLED = "Refilled"


def refill_wait_us(requested_us: int, registered_us: int) -> int:
    """How long a warm create waited for its pool to refill: the member that served it registered
    that long after the create was requested (0: it was idle already, or a time is unknown). On
    Kubernetes a claim is written whether or not a member is idle, and agent-sandbox binds it to
    the next one ready: such a create is warm, but not an instant start."""
    if not requested_us or not registered_us:
        return 0
    return max(0, registered_us - requested_us)


def mark_refilled(status: SandboxStatus) -> None:
    """Say on a warm sandbox's Allocated condition (reason Refilled) that its member registered
    after its request, and how long after; nothing for any other sandbox."""
    timeline = status.timeline
    waited = refill_wait_us(timeline.requested_us, timeline.registered_us)
    allocated = status.condition("Allocated")
    if status.allocation != Allocation.WARM or not waited or allocated is None or allocated.reason == REFILLED:
        return
    message = f"{status.pool}: waited {waited / 1000:.0f} ms for a member (none was idle at the request)"
    status.set_condition(Condition(type="Allocated", status="True", reason=REFILLED, message=message))
