"""The informer loop: resume from the last version seen, relist on 410, restart dropped watches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from warmshell.drivers.kubernetes import kube, watching

Obj = dict[str, Any]
RES = kube.PODS
NO_WAIT = watching.Backoff(relist_seconds=0.0, retry_seconds=0.0)


def obj(name: str, rv: str) -> Obj:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class ScriptedApi:
    """Answers lists and watches from scripts; records what was asked."""

    def __init__(self, lists: list[Obj], watches: list[list[Obj | Exception]]) -> None:
        self.lists = lists
        self.watches = watches
        self.asked: list[tuple[str, str]] = []
        self.done = asyncio.Event()

    async def list(self, resource: kube.Resource, namespace: str, *, label_selector: str = "") -> Obj:
        self.asked.append(("list", label_selector))
        return self.lists.pop(0)

    async def watch(
        self, resource: kube.Resource, namespace: str, *, resource_version: str, label_selector: str = ""
    ) -> AsyncGenerator[Obj, None]:
        self.asked.append(("watch", resource_version))
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item


async def run(api: ScriptedApi) -> tuple[list[list[str]], list[tuple[str, str]]]:
    listed: list[list[str]] = []
    events: list[tuple[str, str]] = []
    task = asyncio.create_task(
        watching.follow(
            api,
            RES,
            "ns",
            label_selector="a=b",
            on_list=lambda items: listed.append([i["metadata"]["name"] for i in items]),
            on_event=lambda kind, o: events.append((kind, o["metadata"]["name"])),
            backoff=NO_WAIT,
        )
    )
    try:
        async with asyncio.timeout(5):
            await api.done.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return listed, events


async def test_watch_resumes_from_the_last_version_seen_including_bookmarks() -> None:
    api = ScriptedApi(
        lists=[{"metadata": {"resourceVersion": "10"}, "items": [obj("a", "9")]}],
        watches=[
            [{"type": "ADDED", "object": obj("b", "11")}, {"type": "BOOKMARK", "object": obj("", "15")}],
            [{"type": "MODIFIED", "object": obj("b", "16")}, kube.Temporary(0, "WatchDropped", "reset")],
        ],
    )
    listed, events = await run(api)
    assert listed == [["a"]]
    assert events == [("ADDED", "b"), ("MODIFIED", "b")]
    assert api.asked == [("list", "a=b"), ("watch", "10"), ("watch", "15"), ("watch", "16")]


async def test_410_relists_and_watches_from_the_new_list() -> None:
    api = ScriptedApi(
        lists=[
            {"metadata": {"resourceVersion": "10"}, "items": [obj("a", "9")]},
            {"metadata": {"resourceVersion": "50"}, "items": [obj("c", "49")]},
        ],
        watches=[[kube.Gone(410, "Expired", "too old")]],
    )
    listed, _ = await run(api)
    assert listed == [["a"], ["c"]]
    assert api.asked == [("list", "a=b"), ("watch", "10"), ("list", "a=b"), ("watch", "50")]
