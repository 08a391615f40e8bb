"""`warmshell gateway wait`: poll the gateway until it answers, so that a script (or a README
block) which starts a gateway in the background never waits on a dead one for ever."""

from __future__ import annotations

import os
import time
from pathlib import Path

from warmshell.cli import client
from warmshell.cli.errors import CliError, ExitCode
from warmshell.cli.options import GlobalOptions

__all__ = ["POLL_INTERVAL_SECONDS", "process_alive", "wait_for_gateway"]

POLL_INTERVAL_SECONDS = 0.1
# Each probe is bounded on its own, so a gateway that accepts but never answers cannot hold the
# wait past its deadline by more than this.
_PROBE_TIMEOUT_SECONDS = 2.0


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by its shell, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    # The state follows the parenthesised command name, which may itself contain spaces.
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_for_gateway(options: GlobalOptions, *, limit_seconds: float, pid: int | None) -> int:
    """Return 0 once a ListPools call succeeds; raise when `pid` exits or `limit_seconds` pass."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.sdk import errors

    deadline = time.monotonic() + limit_seconds
    last = "no answer yet"
    while True:
        if pid is not None and not process_alive(pid):
            raise CliError(
                f"the gateway (pid {pid}) exited before it answered (its error is above)", ExitCode.UNAVAILABLE
            )
        try:
            with client.connect(options, timeout=_PROBE_TIMEOUT_SECONDS) as sdk:
                sdk.service.list_pools(sandbox_pb2.ListPoolsRequest())
            return 0
        except (errors.Unavailable, errors.DeadlineExceeded) as exc:
            last = exc.details  # anything else: it answered, and refused us; waiting will not help
        if time.monotonic() >= deadline:
            raise CliError(f"no gateway answered within {limit_seconds:g} s: {last}", ExitCode.TIMEOUT)
        time.sleep(POLL_INTERVAL_SECONDS)
