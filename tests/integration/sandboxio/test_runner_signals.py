"""The in-process runner's piped path (no terminal) starts a command with every signal at its
default action even when this process ignores some (a gateway or supervisor started by nohup
ignores SIGHUP, one started in a script's background SIGINT and SIGQUIT; an ignored signal stays
ignored across exec), and still in its own session, with its stdin, output, exit status, and a
missing command or workdir told as before."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmshell.sandboxio.interactive import ExecInput
from warmshell.sandboxio.processes import NotStarted, StartFailure, WorkdirError, run_streaming

ENV = {"PATH": "/usr/bin:/bin"}
IGNORED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


@contextlib.contextmanager
def ignoring(numbers: tuple[int, ...]) -> Iterator[None]:
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


async def run(
    command: list[str], *, stdin: bytes = b"", cwd: str = "/", io: ExecInput | None = None
) -> tuple[int, str]:
    output = bytearray()

    async def sink(_stderr: bool, data: bytes) -> None:
        output.extend(data)

    end = await asyncio.wait_for(run_streaming(command, env=ENV, cwd=cwd, sink=sink, stdin=stdin, io=io), 20)
    return end.exit_code, output.decode()


def status(output: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in output.splitlines() if ":\t" in line)


@pytest.mark.parametrize("numbers", [IGNORED, ()], ids=["ignoring-int-quit-hup", "ignoring-none"])
async def test_the_command_ignores_no_signal_and_leads_its_own_session(numbers: tuple[int, ...]) -> None:
    with ignoring(numbers):
        code, output = await run(["sh", "-c", "exec cat /proc/self/status"])
    fields = status(output)
    assert code == 0
    assert int(fields["SigIgn"], 16) == 0, output  # not even SIGPIPE, which this interpreter ignores
    assert int(fields["SigBlk"], 16) == 0, output
    assert fields["NSsid"] == fields["Pid"]  # a new session: a kill of its group reaches its children


async def test_stdin_output_and_exit_status_pass_as_before_while_ignoring() -> None:
    with ignoring(IGNORED):
        code, output = await run(["sh", "-c", "cat; echo err >&2; exit 7"], stdin=b"from stdin\n")
        streamed = ExecInput(terminal=None, credit=lambda _n: None)
        streamed.feed(b"streamed\n")
        streamed.end()
        streamed_code, streamed_output = await run(["cat"], io=streamed)
    assert (code, output) == (7, "from stdin\nerr\n")
    assert (streamed_code, streamed_output) == (0, "streamed\n")


async def test_a_missing_command_or_workdir_is_told_while_ignoring() -> None:
    with ignoring(IGNORED):
        with pytest.raises(NotStarted, match="no-such-command-here: command not found") as missing:
            await run(["no-such-command-here"])
        with pytest.raises(WorkdirError):
            await run(["true"], cwd="/no/such/workdir")
    assert missing.value.failure is StartFailure.COMMAND_NOT_FOUND


async def test_a_signal_sent_to_the_command_ends_it_while_ignoring() -> None:
    with ignoring(IGNORED):
        code, _ = await run(["sh", "-c", "kill -INT $$; sleep 5"])
    assert code == 128 + signal.SIGINT


def running(argv: list[str]) -> list[int]:
    """The pids of processes whose command line is `argv`."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                found.append(int(entry.name))
    return found


async def test_a_start_cancelled_at_any_point_while_ignoring_leaves_no_process() -> None:
    argv = ["sleep", "61.25"]
    with ignoring(IGNORED):
        for delay in (0.0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.05):
            task = asyncio.ensure_future(run(argv))
            await asyncio.sleep(delay)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    deadline = asyncio.get_running_loop().time() + 5
    while running(argv) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert running(argv) == []
