"""Pool lookup by fingerprint: NotReady | NoMatch | Match | Ambiguous."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.ids import Fingerprint
from warmshell.core.matching import Ambiguous, Match, NoMatch, NotReady, PoolIndex

fingerprints = st.sampled_from([Fingerprint(c * 64) for c in "abcd"])


def test_not_synced_is_not_ready() -> None:
    assert PoolIndex[str]().lookup(Fingerprint("a" * 64)) == NotReady()
    assert not PoolIndex[str]().synced
    assert PoolIndex[str]([]).synced


def test_examples() -> None:
    a, b = Fingerprint("a" * 64), Fingerprint("b" * 64)
    index = PoolIndex([(a, "default"), (b, "env-foo"), (b, "env-foo-copy")])
    assert index.lookup(a) == Match("default")
    assert index.lookup(b) == Ambiguous(("env-foo", "env-foo-copy"))
    assert index.lookup(Fingerprint("c" * 64)) == NoMatch()


@given(st.lists(st.tuples(fingerprints, st.integers()), max_size=12), fingerprints)
def test_lookup_agrees_with_a_linear_scan(pools: list[tuple[Fingerprint, int]], fp: Fingerprint) -> None:
    expected = tuple(pool for pool_fp, pool in pools if pool_fp == fp)
    result = PoolIndex(pools).lookup(fp)
    if not expected:
        assert result == NoMatch()
    elif len(expected) == 1:
        assert result == Match(expected[0])
    else:
        assert result == Ambiguous(expected)


@given(st.lists(st.tuples(fingerprints, st.integers()), max_size=12), fingerprints)
def test_unsynced_index_ignores_content(pools: list[tuple[Fingerprint, int]], fp: Fingerprint) -> None:
    index: PoolIndex[int] = PoolIndex(None)
    assert index.lookup(fp) == NotReady()
    assert PoolIndex(pools).synced
