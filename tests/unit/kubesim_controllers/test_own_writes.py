"""``OwnWrites``: a controller's own writes coming back as watch events, and the stale cache."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kubesim.controllers.objects import Obj, OwnWrites


def _version(rv: int, uid: str = "u") -> Obj:
    return {"metadata": {"uid": uid, "name": "s", "resourceVersion": str(rv)}}


def test_the_echo_of_our_own_write_needs_no_reconcile_but_any_other_version_does() -> None:
    own = OwnWrites()
    assert not own.is_echo(_version(5))  # nothing written yet
    own.record(_version(7))
    assert not own.is_echo(_version(6))  # an earlier version: someone else's write
    assert own.is_echo(_version(7))
    assert not own.is_echo(_version(8))
    assert not own.is_echo(_version(7, uid="other"))  # another object (or a recreated one)


def test_a_reconcile_skipped_as_stale_is_owed_by_the_echo() -> None:
    own = OwnWrites()
    own.record(_version(7))
    assert own.is_stale(_version(6))  # a pod event reconciled from a cache behind our write
    assert not own.is_echo(_version(7))  # so the echo must reconcile, once
    assert own.is_echo(_version(7))


def test_a_new_write_settles_what_a_stale_skip_owed() -> None:
    own = OwnWrites()
    own.record(_version(7))
    assert own.is_stale(_version(6))
    own.record(_version(9))  # a later reconcile read a cache past the skip, and wrote
    assert own.is_echo(_version(9))
    own.forget("u")
    assert not own.is_echo(_version(9))


@given(st.lists(st.tuples(st.sampled_from(["write", "cache", "event"]), st.integers(1, 20)), max_size=30))
def test_echoes_follow_a_model_in_which_no_stale_skip_is_lost(steps: list[tuple[str, int]]) -> None:
    """An event is an echo only when it is our last write's version and no reconcile was skipped
    as stale since that write; the first event after such a skip always reconciles."""
    own = OwnWrites()
    written: int | None = None
    owed = False
    for action, rv in steps:
        if action == "write":
            own.record(_version(rv))
            written, owed = rv, False
        elif action == "cache":
            stale = own.is_stale(_version(rv))
            assert stale == (written is not None and rv < written)
            owed = owed or stale
        else:
            assert own.is_echo(_version(rv)) == (not owed and rv == written)
            owed = False
