"""`python -m warmshell ...` with cProfile on the gateway's main thread (its event loop), switched
by signals so that only a benchmark's batch is recorded: SIGUSR1 starts (or resumes) recording,
SIGUSR2 pauses it and writes the statistics so far to the file named by `WARMSHELL_CPROFILE`.

The clock is the thread's CPU time, so other load on a shared machine does not enter the figures;
cProfile's own cost still inflates small, frequently called functions, so read it for the ranking
and the call counts per create, not for absolute times (the gateway CPU figures come from /proc).
A coroutine counts as called again each time it resumes."""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
import time
from types import FrameType

_profile = cProfile.Profile(time.thread_time_ns, 1e-9)


def _start(_signum: int, _frame: FrameType | None) -> None:
    _profile.enable()


def _stop(_signum: int, _frame: FrameType | None) -> None:
    _profile.disable()
    _profile.dump_stats(os.environ["WARMSHELL_CPROFILE"])


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
