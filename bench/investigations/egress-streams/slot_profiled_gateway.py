"""`python -m warmshell ...` with one cProfile per kind of create on the gateway's main thread (its
event loop), switched by signals: SIGRTMIN+K starts (or resumes) recording into profile K (0-3),
SIGUSR2 pauses whichever records, SIGUSR1 writes profile K to `WARMSHELL_CPROFILE`.K for every K
used. The clock is the thread's CPU time (see `bench/profiled_gateway.py` for what to read it for)."""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
import time
from types import FrameType

_SLOTS = 4
_profiles = [cProfile.Profile(time.thread_time_ns, 1e-9) for _ in range(_SLOTS)]
_used: set[int] = set()
_current: list[cProfile.Profile] = []


def _start(slot: int) -> None:
    _pause(0, None)
    _used.add(slot)
    _current.append(_profiles[slot])
    _profiles[slot].enable()


def _pause(_signum: int, _frame: FrameType | None) -> None:
    while _current:
        _current.pop().disable()


def _dump(_signum: int, _frame: FrameType | None) -> None:
    _pause(0, None)
    for slot in sorted(_used):
        _profiles[slot].dump_stats(f"{os.environ['WARMSHELL_CPROFILE']}.{slot}")


if __name__ == "__main__":
    for number in range(_SLOTS):
        signal.signal(signal.SIGRTMIN + number, lambda _s, _f, slot=number: _start(slot))
    signal.signal(signal.SIGUSR2, _pause)
    signal.signal(signal.SIGUSR1, _dump)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
