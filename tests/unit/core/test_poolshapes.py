"""Pools that share a shape are found by name, each naming the others."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core import poolshapes
from warmshell.core.ids import Fingerprint


def test_pools_sharing_a_fingerprint_name_each_other() -> None:
    pools = [("a", Fingerprint("f1")), ("b", Fingerprint("f2")), ("c", Fingerprint("f1")), ("d", Fingerprint("f1"))]
    assert poolshapes.shared_shapes(pools) == {"a": ("c", "d"), "c": ("a", "d"), "d": ("a", "c")}


def test_invalid_pools_without_a_fingerprint_share_nothing() -> None:
    assert poolshapes.shared_shapes([("x", Fingerprint("")), ("y", Fingerprint(""))]) == {}


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.sampled_from(["f1", "f2", "f3"]), max_size=8))
def test_a_pool_is_flagged_exactly_when_another_has_its_fingerprint(pools: dict[str, str]) -> None:
    shared = poolshapes.shared_shapes((name, Fingerprint(fp)) for name, fp in pools.items())
    for name, fp in pools.items():
        others = tuple(sorted(n for n, f in pools.items() if f == fp and n != name))
        assert shared.get(name, ()) == others


def test_message_says_why_and_what_to_do() -> None:
    message = poolshapes.shared_shape_message(["b"], Fingerprint("0123456789abcdef"))
    assert message.startswith("same shape (fingerprint 0123456789ab) as b:")
    assert "Ambiguous" in message
