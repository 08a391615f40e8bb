"""Progress lines between replicas: what is sent, what is published on hearing it, batching."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.ids import SandboxId
from warmshell.drivers.base import ProgressLine
from warmshell.gateway.events import EventBus, Progress
from warmshell.gateway.progressfeed import MAX_MESSAGE_CHARS, MAX_REASON_CHARS, ProgressFeed, decode, encode

SANDBOX = SandboxId("sbx-1")


@given(st.text(max_size=40), st.text(max_size=200), st.text(max_size=3000), st.booleans(), st.integers(0, 2**53))
def test_a_line_survives_the_payload(origin: str, reason: str, message: str, warning: bool, ts: int) -> None:
    payload = encode(origin, SANDBOX, Progress(ts, reason, message, warning))
    line = Progress(ts, reason[:MAX_REASON_CHARS], message[:MAX_MESSAGE_CHARS], warning)
    assert decode(payload) == (origin, SANDBOX, line)
    assert len(payload.encode()) < 8000  # what NOTIFY takes


def test_the_longest_lines_fit_a_notification() -> None:
    for char in ("\x01", "\U0001f600", '"'):
        payload = encode("replica-" + "x" * 32, SANDBOX, Progress(2**53, char * 500, char * 5000, True))
        assert len(payload.encode()) < 8000


def test_unreadable_payloads_are_ignored() -> None:
    for payload in ("", "{", "[]", '{"o": "a"}', '{"o":"a","s":"b","t":"x","r":"","m":"","w":false}'):
        assert decode(payload) is None


async def _published(bus: EventBus, sandbox_id: SandboxId) -> list[Progress]:
    async with bus.subscribe(sandbox_id, replay_output=False) as queue:
        items = []
        while not queue.empty():
            item = queue.get_nowait()
            assert isinstance(item, Progress)
            items.append(item)
        return items


async def test_lines_of_this_replica_go_out_in_one_batch_and_come_back_only_elsewhere() -> None:
    sent: list[list[str]] = []

    async def notify(payloads: list[str]) -> None:
        sent.append(payloads)

    here, there = EventBus(), EventBus()
    mine = ProgressFeed("r1", here, notify)
    theirs = ProgressFeed("r2", there, notify)
    runner = asyncio.create_task(mine.run())
    mine.share(SANDBOX, ProgressLine("PoolHit", "claim created"))
    mine.share(SANDBOX, ProgressLine("Pulling", "pod: pulling image", seen_by_every_replica=True))
    mine.share(SANDBOX, ProgressLine("Registered", "the supervisor registered", warning=True))
    await asyncio.sleep(0.01)
    runner.cancel()
    assert len(sent) == 1  # one statement for what was queued in one turn
    assert [decode(p)[2].reason for p in sent[0]] == ["PoolHit", "Registered"]  # type: ignore[index]
    for payload in sent[0]:  # the channel delivers to every listener, the sender included
        mine.heard(payload)
        theirs.heard(payload)
    assert await _published(here, SANDBOX) == []  # its own lines reached its watchers already
    lines = await _published(there, SANDBOX)
    assert [(p.reason, p.warning) for p in lines] == [("PoolHit", False), ("Registered", True)]


async def test_a_failed_send_is_dropped_and_the_feed_goes_on() -> None:
    from warmshell.core.errors import UnavailableError

    calls: list[int] = []

    async def notify(payloads: list[str]) -> None:
        calls.append(len(payloads))
        if len(calls) == 1:
            raise UnavailableError("the store is unreachable")

    feed = ProgressFeed("r1", EventBus(), notify)
    runner = asyncio.create_task(feed.run())
    feed.share(SANDBOX, ProgressLine("Created", "one"))
    await asyncio.sleep(0.01)
    feed.share(SANDBOX, ProgressLine("Created", "two"))
    await asyncio.sleep(0.01)
    runner.cancel()
    assert calls == [1, 1]
