"""Shared pieces of the local driver's integration tests: the stand-in supervisor and process
introspection."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from warmshell.drivers.local import LocalDriver

DriverFactory = Callable[..., LocalDriver]

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

# Stand-in for the supervisor: reads its credential from the bootstrap fd (via /dev/fd: dash
# redirects only single-digit fds) the way the real one
# does, leaves what it saw in /workspace for the test to inspect, then idles.
STAND_IN = (
    "cat /dev/fd/$WARMSHELL_BOOTSTRAP_FD > /workspace/.credential.tmp; "
    "env > /workspace/env; hostname > /workspace/hostname; "
    "mv /workspace/.credential.tmp /workspace/credential; exec sleep 600"
)


def driver_pids(driver: LocalDriver) -> list[int]:
    """Pids of every live instance of a driver (test introspection)."""
    return [
        i.process.pid
        for i in driver._fleet.instances.values()
        if i.process is not None and i.process.returncode is None
    ]


def alive(pid: int) -> bool:
    """Whether a pid exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status and os.path.exists(f"/proc/{pid}")
