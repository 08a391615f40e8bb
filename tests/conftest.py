"""Suite-wide strictness: no test may leave asyncio tasks or child processes behind."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest


def _children() -> set[int]:
    """PIDs of this process's direct children (Linux)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return {int(p) for p in handle.read().split()}
    except OSError:
        return set()


@pytest.fixture(autouse=True)
def _no_leftover_processes() -> Iterator[None]:
    before = _children()
    yield
    leftover = _children() - before
    if leftover:
        alive = {p for p in leftover if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X")}
        assert not alive, f"test left child processes running: {sorted(alive)}"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


@pytest.fixture(autouse=True)
async def _no_leftover_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    assert not leftover, f"test left asyncio tasks running: {leftover}"
