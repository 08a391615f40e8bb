"""How a command ended is the result's, never text in its output: a timeout, a missing command
or workdir, and `check=True`, through a real gateway (local driver: commands start through the
sandbox's agent), on both sync transports, the async client and process handles."""

from __future__ import annotations

import pytest

import warmshell

KILLED = 9  # a timeout kills the command's process group with SIGKILL


def test_a_timeout_is_told_apart_from_the_commands_own_124(client: warmshell.Client) -> None:
    with client.create() as sb:
        own = sb.run(["sh", "-c", "echo 'timed out after 1s' >&2; exit 124"])
        assert (own.exit_code, own.timed_out, own.signal, own.stderr) == (124, False, 0, b"timed out after 1s\n")
        slow = sb.run(["sh", "-c", "echo started; sleep 30"], timeout=1)
        assert (slow.exit_code, slow.timed_out, slow.signal) == (124, True, KILLED)
        assert (slow.stdout, slow.stderr) == (b"started\n", b"")  # nothing of the system's in its output
        killed = sb.run(["sh", "-c", "kill -TERM $$"])
        assert (killed.exit_code, killed.signal, killed.timed_out) == (143, 15, False)
        events = list(sb.run_stream(["sleep", "30"], timeout=1))
        assert (events[-1].exit_code, events[-1].timed_out) == (124, True)
        assert all(not e.stderr for e in events)


def test_a_command_or_workdir_that_is_missing_is_an_error_of_the_result(client: warmshell.Client) -> None:
    with client.create() as sb:
        missing = sb.run(["no-such-program"], workdir="/tmp")
        assert (missing.exit_code, missing.error, missing.stderr) == (127, warmshell.ExecError.COMMAND_NOT_FOUND, b"")
        assert missing.outcome.error_message == "no-such-program: command not found"
        sb.run(["sh", "-c", "echo '#!/bin/sh' > /workspace/script"])
        refused = sb.run(["/workspace/script"])
        assert (refused.exit_code, refused.error) == (126, warmshell.ExecError.NOT_EXECUTABLE)
        nowhere = sb.run(["true"], workdir="/nope")
        assert (nowhere.exit_code, nowhere.error, nowhere.stderr) == (125, warmshell.ExecError.WORKDIR, b"")
        assert nowhere.outcome.error_message == "workdir /nope does not exist"
        not_dir = sb.run(["true"], workdir="/workspace/script")
        assert not_dir.outcome.error_message == "workdir /workspace/script is not a directory"


def test_check_raises_command_failed_and_command_timeout(client: warmshell.Client) -> None:
    with client.create() as sb:
        assert sb.run(["true"], check=True).ok
        with pytest.raises(warmshell.CommandFailed) as failed:
            sb.run(["sh", "-c", "echo compiling; echo 'error: no rule' >&2; exit 2"], check=True)
        assert (failed.value.exit_code, failed.value.stderr_tail) == (2, "error: no rule")
        assert failed.value.result.stdout == b"compiling\n"
        with pytest.raises(warmshell.CommandTimeout) as timeout:
            sb.run(["sleep", "30"], timeout=1, check=True)
        assert isinstance(timeout.value, warmshell.CommandFailed)
        assert timeout.value.result.timed_out
        with pytest.raises(warmshell.CommandFailed, match="never started: nope: command not found"):
            sb.run(["nope"], check=True)


def test_process_handles_carry_the_outcome(client: warmshell.Client) -> None:
    with client.create() as sb:
        with sb.start(["sleep", "30"], timeout=1) as process:
            assert process.wait() == 124
            assert process.timed_out
            assert process.outcome is not None
            assert process.outcome.signal == KILLED
        with sb.pty(["no-such-shell"]) as terminal:
            assert terminal.wait() == 127
            assert terminal.outcome is not None
            assert terminal.outcome.error is warmshell.ExecError.COMMAND_NOT_FOUND


async def test_the_async_client_has_the_same_outcomes(aclient: warmshell.AsyncClient) -> None:
    async with await aclient.create() as sb:
        slow = await sb.run(["sleep", "30"], timeout=1)
        assert (slow.exit_code, slow.timed_out, slow.signal, slow.stderr) == (124, True, KILLED, b"")
        events = [e async for e in sb.run_stream(["no-such-program"])]
        assert (events[-1].exit_code, events[-1].error) == (127, warmshell.ExecError.COMMAND_NOT_FOUND)
        with pytest.raises(warmshell.CommandTimeout):
            await sb.run(["sleep", "30"], timeout=1, check=True)
        with pytest.raises(warmshell.CommandFailed, match="exited 3"):
            await sb.run(["sh", "-c", "exit 3"], check=True)
        process = await sb.start(["sleep", "30"], timeout=1)
        async with process:
            assert await process.wait() == 124
        assert process.timed_out
