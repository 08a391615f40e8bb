"""The workload side of a pod's supervisor outside Kubernetes: the real C agent connecting to the
supervisor's agent socket (`WARMSHELL_AGENT_SOCKET`), as the workload container's PID 1 does.
A supervisor runs commands only through such an agent."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from warmshell.drivers.local.runtime.launching import AGENT_BINARY

__all__ = ["PID_1", "start_agent", "workload_agent"]


# The agent runs only as PID 1 (its exit must end everything it started): bwrap gives it a PID
# namespace and nothing else, as kubesim does the workload container.
PID_1 = ("bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--as-pid-1", "--die-with-parent")


def start_agent(socket: Path, *, wrap: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """The agent, connecting to `socket` (it retries until the supervisor listens there, and
    exits when the supervisor's connection closes); `wrap` prefixes its command (another uid)."""
    argv = [*wrap, *PID_1, str(AGENT_BINARY), "--connect", str(socket)]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def workload_agent(socket: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`start_agent`, stopped and reaped on exit."""
    agent = start_agent(socket)
    try:
        yield agent
    finally:
        agent.kill()
        agent.wait()
