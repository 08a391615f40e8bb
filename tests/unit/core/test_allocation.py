"""The warm-or-cold decision: warm only for exactly one matching pool, with pooling configured
and the driver ready; every other case is cold with the reason, checked in a fixed order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import allocation, matching
from warmshell.core.allocation import Cold, MissReason, Warm
from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.core.ids import Fingerprint

WORKSPACES = ("default", "other")
ENVIRONMENTS = ({}, {"FOO": "bar"})
shapes = st.builds(
    SandboxShape,
    workspace=st.sampled_from(WORKSPACES),
    image=st.sampled_from(("", "img:1")),
    environment=st.sampled_from(ENVIRONMENTS),
    cpu_millis=st.sampled_from((0, 500, 1000)),
)
pool_lists = st.lists(st.tuples(shapes, st.integers(min_value=0, max_value=9)), max_size=8)


def index(pools: list[tuple[SandboxShape, int]]) -> matching.PoolIndex[int]:
    return matching.PoolIndex((fingerprint(shape), name) for shape, name in pools)


@given(shapes, pool_lists, st.booleans(), st.booleans(), st.booleans())
def test_the_decision_agrees_with_a_linear_scan(
    shape: SandboxShape, pools: list[tuple[SandboxShape, int]], configured: bool, ready: bool, synced: bool
) -> None:
    lookup = (index(pools) if synced else matching.PoolIndex[int]()) if configured else None
    decision = allocation.decide(shape, lookup, ready=ready)
    # Shapes that mean the same sandbox (0.5 == 500m) share a fingerprint, so match each other.
    matching_pools = tuple(name for pool_shape, name in pools if fingerprint(pool_shape) == fingerprint(shape))
    if not configured:
        assert decision == Cold(MissReason.DISABLED)
    elif not ready or not synced:
        assert decision == Cold(MissReason.NOT_READY)
    elif not matching_pools:
        assert decision == Cold(MissReason.NO_MATCH)
    elif len(matching_pools) == 1:
        assert decision == Warm(matching_pools[0])
    else:
        assert decision == Cold(MissReason.AMBIGUOUS, matching_pools)


@given(shapes, pool_lists)
def test_only_an_ambiguous_match_charges_pools(shape: SandboxShape, pools: list[tuple[SandboxShape, int]]) -> None:
    decision = allocation.decide(shape, index(pools), ready=True)
    if isinstance(decision, Cold) and decision.charged:
        assert decision.reason == MissReason.AMBIGUOUS
        assert len(decision.charged) >= 2


def test_disabled_wins_over_not_ready_and_not_ready_over_a_lookup() -> None:
    class Refuses:
        def lookup(self, fp: Fingerprint) -> matching.MatchResult[str]:
            raise AssertionError("no lookup when the driver cannot serve warm")

    shape = SandboxShape(workspace="default", image="")
    assert allocation.decide(shape, None, ready=False) == Cold(MissReason.DISABLED)
    assert allocation.decide(shape, Refuses(), ready=False) == Cold(MissReason.NOT_READY)


def test_a_matched_pool_without_an_idle_member_is_empty_and_charged() -> None:
    shape = SandboxShape(workspace="default", image="")
    decision = allocation.decide(shape, matching.PoolIndex([(fingerprint(shape), "p")]), ready=True)
    assert decision == Warm("p")
    assert allocation.empty("p") == Cold(MissReason.EMPTY, ("p",))


def test_the_drivers_reasons_are_the_cores() -> None:
    from warmshell.drivers import base

    assert base.MissReason is MissReason
    assert [r.value for r in MissReason] == ["NotReady", "NoMatch", "Ambiguous", "Empty", "Disabled"]
