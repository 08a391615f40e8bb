"""Suite-wide strictness: no test may leave asyncio tasks or child processes behind."""

from __future__ import annotations

import asyncio
import os
import time
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
    # A child killed during teardown may take a moment to exit on a loaded machine: what counts
    # is one still running after that (a CI run once failed on a child it could not name).
    deadline = time.monotonic() + 2.0
    while alive := {p for p in leftover if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X")}:
        if time.monotonic() > deadline:
            named = {p: _cmdline(p) for p in sorted(alive)}
            raise AssertionError(f"test left child processes running: {named}")
        time.sleep(0.02)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


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
