"""A command's timeout counts from its start, also while its stdin is still being written: a
command that never reads more stdin than a pipe holds is killed at its timeout (124), not left
running with the supervisor blocked on the write (found: the in-process runner, a pod's
supervisor, wrote the request's stdin before the timeout began, so such an exec never ended).
And an exec ends when its command exits, even when a process it left (in a session of its own,
out of reach of the exec's kill) holds its stdin unread (found: the local driver wrote stdin
from a thread of the gateway's default executor and waited for it, so each such exec hung and
kept a thread; a handful took every thread the executor has)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

from tests.helpers.gateway import running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox
from warmshell.sandboxio.processes import EXIT_TIMEOUT, Ended, run_streaming

ENV = {"PATH": "/usr/bin:/bin"}
STDIN = b"x" * (512 * 1024)  # far more than a pipe holds, within a request


async def test_the_in_process_runner_times_out_a_command_that_does_not_read_its_stdin(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    output = bytearray()

    async def sink(stderr: bool, data: bytes) -> None:
        output.extend(data)

    start = time.monotonic()
    command = ["/bin/sh", "-c", f"echo $$ > {marker}; exec sleep 60"]
    end = await asyncio.wait_for(run_streaming(command, env=ENV, cwd="/", sink=sink, stdin=STDIN, timeout=1), 20)
    assert end == Ended(EXIT_TIMEOUT, signal=signal.SIGKILL, timed_out=True)
    assert time.monotonic() - start < 10
    assert output == b""  # the timeout is the result's, never text in the command's output
    pid = int(marker.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass  # killed, and reaped
    else:
        raise AssertionError(f"the command {pid} still runs")


async def test_a_command_that_reads_its_stdin_gets_all_of_it_within_the_timeout() -> None:
    output = bytearray()

    async def sink(stderr: bool, data: bytes) -> None:
        output.extend(data)

    end = await run_streaming(["wc", "-c"], env=ENV, cwd="/", sink=sink, stdin=STDIN, timeout=30)
    assert (end, output.strip()) == (Ended(0), str(len(STDIN)).encode())


@needs_bwrap
async def test_an_exec_with_unread_stdin_ends_at_its_timeout_on_the_local_driver(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, "sb")
        start = time.monotonic()
        code, _, err = await gw.exec("sb", ["sleep", "60"], stdin=STDIN, timeout_seconds=1)
        assert code == EXIT_TIMEOUT, err
        assert time.monotonic() - start < 10
        _, out, _ = await gw.exec("sb", ["/bin/sh", "-c", "ps -eo comm"])
        assert b"sleep" not in out.split()


# The command leaves a process in its own session holding its stdin, unread, and exits.
HOLDER = "exec 3<&0; setsid sleep 600 <&3 3<&- >/dev/null 2>&1 & exit 0"


async def test_the_in_process_runner_ends_when_the_command_exits_though_its_stdin_is_held(tmp_path: Path) -> None:
    async def sink(stderr: bool, data: bytes) -> None:
        pass

    marker = tmp_path / "holder"
    command = ["/bin/sh", "-c", HOLDER.replace("& exit 0", f"& echo $! > {marker}; exit 0")]
    start = time.monotonic()
    try:
        run = run_streaming(command, env=ENV, cwd="/", sink=sink, stdin=STDIN)
        assert await asyncio.wait_for(run, 20) == Ended(0)
        assert time.monotonic() - start < 10
    finally:
        if marker.exists():  # it left its session: no one else ends it
            os.kill(int(marker.read_text()), 9)


@needs_bwrap
async def test_execs_whose_stdin_is_held_end_and_hold_no_gateway_thread(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, "sb")
        threads = threading.active_count()
        start = time.monotonic()
        for _ in range(8):  # more than the default executor's threads on a small host
            assert await asyncio.wait_for(gw.exec("sb", ["/bin/sh", "-c", HOLDER], stdin=STDIN), 20) == (0, b"", b"")
        assert time.monotonic() - start < 20
        assert threading.active_count() <= threads + 1
        _, out, _ = await gw.exec("sb", ["/bin/sh", "-c", "ps -eo comm | grep -c sleep"])
        assert out == b"8\n"  # the holders still run: nothing waited for them
