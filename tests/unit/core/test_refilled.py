"""A warm create whose member registered after its request waited for its pool to refill: its
Allocated condition says so (reason Refilled, how long), and nothing else is marked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import allocation
from warmshell.core.models import Condition, SandboxStatus
from warmshell.core.states import Allocation

HIT = Condition(type="Allocated", reason="PoolHit", message="foo")


def status(kind: Allocation, requested_us: int, registered_us: int) -> SandboxStatus:
    result = SandboxStatus(allocation=kind, pool="foo", conditions=[HIT])
    result.timeline.requested_us, result.timeline.registered_us = requested_us, registered_us
    return result


@given(st.integers(0, 2**50), st.integers(0, 2**50))
def test_the_wait_is_the_registration_after_the_request(requested: int, registered: int) -> None:
    waited = allocation.refill_wait_us(requested, registered)
    assert waited == (registered - requested if requested and registered and registered > requested else 0)


def test_a_warm_create_served_by_a_later_member_is_marked_refilled() -> None:
    late = status(Allocation.WARM, 1_000_000, 1_412_000)
    allocation.mark_refilled(late)
    allocated = late.condition("Allocated")
    assert allocated is not None
    assert (allocated.reason, allocated.message) == (
        "Refilled",
        "foo: waited 412 ms for a member (none was idle at the request)",
    )


def test_instant_starts_and_cold_creates_keep_their_reason() -> None:
    for unchanged in (
        status(Allocation.WARM, 1_000_000, 999_000),  # idle before the request
        status(Allocation.WARM, 1_000_000, 0),  # not registered yet
        status(Allocation.COLD, 1_000_000, 1_412_000),  # cold members always register later
    ):
        allocation.mark_refilled(unchanged)
        assert unchanged.condition("Allocated") == HIT
