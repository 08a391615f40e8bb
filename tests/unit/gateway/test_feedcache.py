"""The rows a replica keeps of a shared store: never behind a change it has heard of, none while
the change feed is lost, and its own writes' echoes no news to its watchers."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from warmshell.gateway.feedcache import FeedCache
from warmshell.gateway.store.base import StoredObject


def _row(sandbox_id: str, version: int) -> StoredObject:
    return StoredObject("sandbox", sandbox_id, sandbox_id, "default", version, "{}")


def _kept(cache: FeedCache, row: StoredObject) -> None:
    with cache.fetching() as since:
        cache.keep(row, since=since)


def test_a_row_is_kept_until_a_newer_version_is_heard_and_watchers_are_told_each_version_once() -> None:
    cache = FeedCache()
    _kept(cache, _row("a", 1))
    assert cache.row("a") is None  # the feed is not listening yet: nothing is kept
    cache.feed(up=True)
    _kept(cache, _row("a", 1))
    assert cache.row("a") == _row("a", 1)
    _kept(cache, _row("a", 2))  # this replica's write of version 2, answered
    assert cache.tell("a", 2)  # its watchers are told
    assert not cache.heard("a", 2)  # its echo: they were told already
    assert cache.row("a") == _row("a", 2)
    assert cache.heard("a", 3)  # another replica's write
    assert cache.row("a") is None
    _kept(cache, _row("a", 3))
    assert not cache.tell("a", 3)  # (a write's answer after its echo: told by the echo)
    assert cache.row("a") == _row("a", 3)
    _kept(cache, _row("a", 4))  # read before its notification came
    assert cache.heard("a", 4)  # news to the watchers all the same
    assert cache.row("a") == _row("a", 4)
    assert cache.heard("a", 0)  # a version not said: forgotten, and told
    assert cache.row("a") is None


def test_an_answer_that_may_predate_a_change_heard_meanwhile_is_not_kept() -> None:
    cache = FeedCache()
    cache.feed(up=True)
    with cache.fetching() as since:
        cache.heard("a", 5)  # version 5 committed while the read (which saw 4) was on its way
        cache.keep(_row("a", 4), since=since)
        cache.keep(_row("b", 1), since=since)  # another row: nothing was heard of it
    assert cache.row("a") is None
    assert cache.row("b") == _row("b", 1)
    with cache.fetching() as since:
        cache.feed(up=False)
        cache.feed(up=True)
        cache.keep(_row("c", 1), since=since)  # the feed was lost meanwhile: anything may have moved
    assert cache.row("c") is None
    cache.feed(up=False)
    assert cache.row("b") is None


@dataclass
class _Model:
    """A store of one row and the notifications of its writes, delivered in order, late."""

    version: int = 1
    undelivered: list[int] = field(default_factory=list)
    newest_heard: int = 0
    up: bool = True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["write", "deliver", "start", "finish", "lose", "regain"]), max_size=60))
def test_the_kept_row_is_never_behind_a_change_heard_while_listening(steps: list[str]) -> None:
    cache = FeedCache()
    cache.feed(up=True)
    model = _Model()
    reads: list[tuple[contextlib.ExitStack, int, int]] = []  # (its call, since, the version it saw)
    for step in steps:
        if step == "write":
            model.version += 1
            if model.up:
                model.undelivered.append(model.version)
        elif step == "deliver" and model.undelivered:
            heard = model.undelivered.pop(0)
            cache.heard("a", heard)
            model.newest_heard = max(model.newest_heard, heard)
        elif step == "start":
            stack = contextlib.ExitStack()
            reads.append((stack, stack.enter_context(cache.fetching()), model.version))
        elif step == "finish" and reads:
            stack, since, seen = reads.pop(0)
            cache.keep(_row("a", seen), since=since)
            stack.close()
        elif step == "lose" and model.up:
            model.up, model.undelivered = False, []
            cache.feed(up=False)
        elif step == "regain" and not model.up:
            model.up = True
            cache.feed(up=True)
            model.newest_heard = model.version  # the gap: everything is read again from here
        kept = cache.row("a")
        if kept is not None:
            assert model.up
            assert kept.resource_version >= model.newest_heard
