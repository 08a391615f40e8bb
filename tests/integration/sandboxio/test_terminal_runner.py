"""The in-process runner (a pod's supervisor) on a terminal: a pty of this host whose slave is
the command's controlling terminal in a session of its own, sized as asked, fed and signalled
through ExecInput, with the shell's exit statuses. The process is threaded (grpc), so nothing but
a fresh interpreter runs between fork and exec: many starts in a row must never crash a child."""

from __future__ import annotations

import asyncio
import re
import signal

import pytest

from warmshell.sandboxio.interactive import DEFAULT_SIZE, ExecInput, WindowSize
from warmshell.sandboxio.processes import NotStarted, StartFailure, run_streaming


async def run_on_terminal(command: list[str], typed: bytes = b"", size: WindowSize = DEFAULT_SIZE) -> tuple[int, bytes]:
    """Run `command` on a terminal; `typed` is typed once it printed "ready"."""
    output = bytearray()
    io = ExecInput(terminal=size, credit=lambda n: None)

    async def sink(stderr: bool, data: bytes) -> None:
        output.extend(data)
        if typed and b"ready" in output and b"ready" not in output[: len(output) - len(data)]:
            io.feed(typed)

    end = await asyncio.wait_for(run_streaming(command, env={"PATH": "/usr/bin:/bin"}, cwd="/", sink=sink, io=io), 30)
    return end.exit_code, bytes(output)


async def test_the_command_leads_a_session_on_its_terminal() -> None:
    script = "tty; stty size; cat /proc/$$/stat; exit 9"
    code, output = await run_on_terminal(["sh", "-c", script], size=WindowSize(17, 61))
    assert code == 9
    lines = output.decode().split("\r\n")
    assert re.fullmatch(r"/dev/pts/\d+", lines[0]), output
    assert lines[1] == "17 61"
    pid_text, rest = lines[2].split(" ", 1)
    pgrp, session, tty_nr = rest.rsplit(")", 1)[1].split()[2:5]
    assert int(pgrp) == int(session) == int(pid_text)  # its own session and group
    assert int(tty_nr) != 0  # with a controlling terminal


async def test_ctrl_c_typed_on_the_terminal_interrupts_and_not_found_is_not_started() -> None:
    code, _ = await run_on_terminal(["sh", "-c", "echo ready; read line; echo never"], typed=b"\x03")
    assert code == 130
    # Told by the result, not written on the terminal the command would have had.
    with pytest.raises(NotStarted, match="no-such-command-here: command not found") as missing:
        await run_on_terminal(["no-such-command-here"])
    assert missing.value.failure is StartFailure.COMMAND_NOT_FOUND


async def test_many_terminal_starts_in_a_threaded_process_never_crash_a_child() -> None:
    codes = await asyncio.gather(*(run_on_terminal(["sh", "-c", "exit 3"]) for _ in range(20)))
    assert [code for code, _ in codes] == [3] * 20


async def test_signals_this_process_ignores_have_their_default_action_in_the_command() -> None:
    # A runner started by nohup or in a script's background ignores SIGHUP, SIGINT, SIGQUIT, and
    # an ignored signal stays ignored across exec: Ctrl-C would do nothing in the command.
    ignored = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in ignored}
    try:
        code, output = await run_on_terminal(["sh", "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"])
        interrupted, _ = await run_on_terminal(["sh", "-c", "echo ready; read line"], typed=b"\x03")
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert code == 0
    masks = dict(line.split(":") for line in output.decode().split("\r\n") if line)
    # The command's own masks (sh exec'd it): sh's own, read while it waits for a child, show
    # every signal blocked (dash blocks them around its wait) about half the time.
    assert int(masks["SigIgn"], 16) == 0, output
    assert int(masks["SigBlk"], 16) == 0, output
    assert interrupted == 130
