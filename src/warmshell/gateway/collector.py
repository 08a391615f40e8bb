"""The gateway's use of Python's cyclic garbage collector: full passes at quiet moments.

CPython starts a full collection (the oldest generation) by itself whenever the objects that
survived the young collections have grown by a quarter since the last one, and a full collection
traverses every tracked object the process holds. A gateway holding 1,000 idle members holds
~100k of them (their host-side supervisors, sessions and records): each full pass took 33-80 ms
of the event loop, and it ran in the middle of whichever create was going on. That was the
1,000-idle tail (bench/HISTORY.md, "the collector's full passes").

So the interpreter keeps its young collections (cheap: they traverse only what is new) but never
starts a full pass itself. The gateway runs one once `interval` has passed since the last and no
create is in flight or has just started, or unconditionally once `overdue` has passed, so cyclic
garbage that lived long enough to reach the oldest generation (a deleted sandbox's objects, say)
is still reclaimed within a bounded time. What start-up allocated is frozen and never traversed
again. Every pause is exported as `warmshell_gc_pause_seconds` by generation.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from warmshell.gateway import metrics

__all__ = ["FullCollections", "full_pass_due", "install"]

log = logging.getLogger(__name__)

# The oldest generation's threshold counts young (generation 1) collections; this many never come.
_NEVER = 2**31 - 1
# How often the gateway looks for a quiet moment once a full pass is due.
_TICK_SECONDS = 0.25


def install(young_threshold: int) -> None:
    """After start-up: freeze everything allocated so far (modules, the wiring, the protobuf and
    pydantic machinery) out of the collector's sight for good, collect the young generation every
    `young_threshold` allocations, leave full passes to `FullCollections`, and time every pause."""
    gc.collect()
    gc.freeze()
    _, middle, _ = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, _NEVER)
    if not any(getattr(c, "__qualname__", "") == _timed.__qualname__ for c in gc.callbacks):
        gc.callbacks.append(_timed)


_started = 0.0


def _timed(phase: str, info: dict[str, Any]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    else:
        metrics.GC_PAUSE_SECONDS.labels(generation=str(info["generation"])).observe(time.perf_counter() - _started)


def full_pass_due(since_last: float, busy: bool, interval: float, overdue: float) -> bool:
    """Whether to run a full pass now: past `interval` at a quiet moment, past `overdue` always."""
    return since_last >= overdue or (since_last >= interval and not busy)


class FullCollections:
    """Runs the full collections the interpreter no longer starts by itself (see the module doc).
    `busy` says whether a create is in flight or has just started."""

    def __init__(self, busy: Callable[[], bool], *, interval: float, overdue: float) -> None:
        self._busy = busy
        self._interval = interval
        self._overdue = max(overdue, interval)
        self._last = time.monotonic()

    def maybe_collect(self) -> bool:
        """Run a full pass if one is due (`full_pass_due`); True if it ran."""
        now = time.monotonic()
        if not full_pass_due(now - self._last, self._busy(), self._interval, self._overdue):
            return False
        found = gc.collect(2)
        self._last = time.monotonic()
        log.debug("full collection: %d unreachable objects, %.1f ms", found, (self._last - now) * 1000)
        return True

    async def run(self) -> None:
        """Look for a due pass every quarter second until cancelled."""
        while True:
            await asyncio.sleep(_TICK_SECONDS)
            self.maybe_collect()
