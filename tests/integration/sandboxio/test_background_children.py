"""The in-process runner (a pod's supervisor, the local driver's unisolated mode) ends an exec
when its command exits, as the agent-backed runner does: a background child that inherited the
command's stdout (`sleep 60 &`) neither holds the exec open nor loses the command's own output,
and it keeps running. Also on a terminal (a shell that left a job running)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from warmshell.sandboxio.interactive import DEFAULT_SIZE, ExecInput
from warmshell.sandboxio.processes import run_streaming

ENV = {"PATH": "/usr/bin:/bin"}
SIZE = 2 * 1024 * 1024  # more than a pipe holds: some of it is still queued when the command exits


async def run(command: list[str], *, io: ExecInput | None = None, slow: bool = False) -> tuple[int, bytes, float]:
    output = bytearray()

    async def sink(stderr: bool, data: bytes) -> None:
        output.extend(data)
        if slow:
            await asyncio.sleep(0.001)

    start = time.monotonic()
    end = await asyncio.wait_for(run_streaming(command, env=ENV, cwd="/", sink=sink, io=io), 20)
    return end.exit_code, bytes(output), time.monotonic() - start


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_background_child_neither_holds_the_exec_nor_loses_its_output() -> None:
    code, out, took = await run(["sh", "-c", f"sleep 60 & head -c {SIZE} /dev/zero; echo; echo $!"], slow=True)
    assert code == 0
    assert took < 15, "the exec waited for the background sleep"
    assert out[:SIZE] == bytes(SIZE), "everything the command wrote is delivered"
    child = int(out[SIZE:].split()[0])
    try:
        assert alive(child), "the background child runs on"
    finally:
        os.kill(child, signal.SIGKILL)


async def test_nor_does_a_child_that_keeps_writing() -> None:
    code, out, _ = await run(["sh", "-c", "yes & echo started"])
    assert code == 0
    assert b"started\n" in out
    assert set(out.replace(b"started\n", b"")) <= set(b"y\n")


async def test_on_a_terminal_a_job_left_running_does_not_hold_the_exec() -> None:
    io = ExecInput(terminal=DEFAULT_SIZE, credit=lambda n: None)
    # In a session of its own, so the shell's exit does not hang it up; it still holds the terminal.
    code, out, took = await run(["sh", "-c", "setsid sleep 60 & echo $!; echo bye"], io=io)
    assert code == 0
    assert took < 15
    pid_line, bye = out.replace(b"\r", b"").split()
    assert bye == b"bye"
    with contextlib.suppress(ProcessLookupError):  # the terminal's hangup may have ended it
        os.kill(int(pid_line), signal.SIGKILL)
