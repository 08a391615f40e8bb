"""The event bus: record changes reach the watchers there are, and progress and output are kept
for watchers that come later, but a change nobody watches leaves nothing behind."""

from __future__ import annotations

from warmshell.core.ids import SandboxId
from warmshell.gateway.events import Changed, EventBus, Output, Progress


async def test_unwatched_changes_keep_nothing_and_buffers_replay_to_later_watchers() -> None:
    bus = EventBus()
    quiet, busy = SandboxId("sb-quiet"), SandboxId("sb-busy")
    bus.publish(quiet, Changed())
    assert quiet not in bus._channels  # a write nobody watches costs no channel
    bus.publish(busy, Progress(1, "Spawning", "starting"))
    bus.publish(busy, Output(stderr=False, data=b"hi"))
    async with bus.subscribe(busy, replay_output=True) as queue:
        assert [queue.get_nowait(), queue.get_nowait()] == [
            Progress(1, "Spawning", "starting"),
            Output(stderr=False, data=b"hi"),
        ]
        bus.publish(busy, Changed())
        assert queue.get_nowait() == Changed()
    async with bus.subscribe(quiet, replay_output=False) as queue:
        assert queue.empty()
        bus.publish(quiet, Changed())
        assert queue.get_nowait() == Changed()


def test_on_change_hears_every_change_and_deletion_watched_or_not_and_none_when_all_may_have_changed() -> None:
    bus = EventBus()
    heard: list[SandboxId | None] = []
    bus.on_change(heard.append)
    sandbox = SandboxId("sb-1")
    bus.publish(sandbox, Changed())  # nobody watches it
    bus.publish(sandbox, Output(stderr=False, data=b"x"))
    bus.publish(sandbox, Progress(1, "Pulling", "pulling"))
    bus.forget(sandbox)
    bus.changed_everywhere()
    assert heard == [sandbox, sandbox, None]
