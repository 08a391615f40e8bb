"""Interactive execs against a real gateway process (bwrap'd sandboxes, the agent as pid 1):
a pseudo-terminal in the sandbox driven through `sb.pty` (its own /dev/pts, resizes, Ctrl-C,
exit codes), signals without a terminal, streamed stdin for `run`/`run_stream` (sync and
async, 200 MB through sha256sum with the gateway's memory flat), and a workload's attempts to
reach past its terminal."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.cli import CliGateway
from warmshell.sdk.interactive import Process


def read_until(process: Process, pattern: bytes, timeout: float = 20.0) -> bytes:
    """Output until `pattern` (a regex) matches it; fails with what came when it does not."""
    seen = b""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, seen):
        assert time.monotonic() < deadline, f"no {pattern!r} in {seen!r}"
        event = process.recv()
        assert event is not None, f"ended before {pattern!r}: {seen!r}"
        assert event.exit_code is None, f"exited {event.exit_code} before {pattern!r}: {seen!r}"
        seen += event.stdout + event.stderr
    return seen


@pytest.fixture
def sandbox(client: warmshell.Client) -> Iterator[warmshell.Sandbox]:
    with client.create() as sb:
        yield sb


def test_a_pty_is_the_sandboxes_own_terminal_and_follows_resizes(sandbox: warmshell.Sandbox) -> None:
    with sandbox.pty(["sh"], rows=30, columns=100) as shell:
        shell.send("tty; stty size; echo T=$TERM\n")
        seen = read_until(shell, rb"T=xterm\S*\r\n")  # the output, not the echo of the typed line
        assert re.search(rb"/dev/pts/\d+\r\n", seen), seen
        assert b"30 100\r\n" in seen
        assert b"T=xterm-256color" in seen
        shell.resize(50, 132)
        shell.send("stty size\n")
        assert b"50 132\r\n" in read_until(shell, rb"50 132\r\n")
        # A program waiting for SIGWINCH gets it, and reads the new size.
        shell.send(
            "python3 -c 'import os, signal; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGWINCH]);"
            ' print("wait" + "ing", flush=True); signal.sigwait([signal.SIGWINCH]);'
            ' print("size", *os.get_terminal_size())\'\n'
        )
        read_until(shell, rb"waiting\r\n")
        shell.resize(40, 90)
        read_until(shell, rb"size 90 40\r\n")
        shell.send("exit 7\n")
        assert shell.wait() == 7


def test_the_terminal_belongs_to_the_workload_uid(sandbox: warmshell.Sandbox) -> None:
    # Opened by the gateway (host root when each sandbox has its own uid), the slave would be
    # owned by a uid the sandbox cannot see ("nobody"): the workload could then not chmod it,
    # and `mesg`, `script` or ssh-style tools refuse a terminal their user does not own.
    with sandbox.pty(["sh"]) as shell:
        shell.send('stat -c "owner=%u:%g mode=%a" "$(tty)"; echo uid=$(id -u):$(id -g); exit\n')
        seen = read_until(shell, rb"uid=\d+:\d+\r\n")
        assert shell.wait() == 0
    owner = re.search(rb"owner=(\d+):(\d+) mode=(\d+)\r\n", seen)
    user = re.search(rb"uid=(\d+):(\d+)\r\n", seen)
    assert owner is not None, seen
    assert user is not None, seen
    assert owner.group(1, 2) == user.group(1, 2), seen
    assert owner.group(3) == b"620", seen  # rw for its user, w for its group, nothing for others


def test_ctrl_c_on_the_pty_interrupts_the_foreground_command_only(sandbox: warmshell.Sandbox) -> None:
    with sandbox.pty(["sh"]) as shell:
        shell.send("sleep 100\n")
        time.sleep(0.5)  # let the shell start sleep in the foreground
        started = time.monotonic()
        shell.send(b"\x03")
        shell.send("echo after=$?\n")  # the interactive shell itself survived the interrupt
        assert b"after=130" in read_until(shell, rb"after=\d+")
        assert time.monotonic() - started < 10
        shell.send("echo alive-$((40+2))\n")
        read_until(shell, rb"alive-42\r\n")
        shell.send(b"\x04")  # EOF on the terminal: the shell exits 0
        assert shell.wait() == 0


def test_a_signal_without_a_terminal_reaches_the_process_group(sandbox: warmshell.Sandbox) -> None:
    process = sandbox.start(["sh", "-c", "trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 0.1; done"])
    with process:
        read_until(process, rb"ready\n")
        process.signal(signal.SIGINT)
        assert b"got-int" in read_until(process, rb"got-int")
        assert process.wait() == 3


def test_streamed_stdin_reaches_a_pipe_and_ends_with_eof(sandbox: warmshell.Sandbox) -> None:
    with sandbox.start(["sh", "-c", "while read line; do echo got:$line; done; echo eof"]) as process:
        process.send("a\n")
        assert b"got:a" in read_until(process, rb"got:a\n")
        process.send(b"b\nc\n")
        read_until(process, rb"got:c\n")
        process.close_stdin()
        read_until(process, rb"eof\n")
        assert process.wait() == 0
    chunks = (bytes([65 + i % 26]) * 1000 for i in range(100))
    r = sandbox.run(["wc", "-c"], stdin=chunks)
    assert (r.exit_code, r.stdout.strip()) == (0, b"100000")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_200_mb_of_streamed_stdin_with_flat_gateway_memory(gateway: CliGateway, sandbox: warmshell.Sandbox) -> None:
    size = 200 * 1024 * 1024
    block = os.urandom(1024 * 1024)
    expected = hashlib.sha256()
    for _ in range(size // len(block)):
        expected.update(block)
    before = rss_kib(gateway.process.pid)
    peak = [before]

    def source() -> Iterator[bytes]:
        for i in range(size // len(block)):
            if i % 20 == 0:
                peak.append(rss_kib(gateway.process.pid))
            yield block

    r = sandbox.run(["sha256sum"], stdin=source(), timeout=300)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split()[0].decode() == expected.hexdigest()
    # The gateway holds a window of the input, never the input: far below the 200 MB it relayed.
    assert max(peak) - before < 64 * 1024, (before, max(peak))


def test_a_workload_cannot_inject_into_anything_but_its_own_terminal(sandbox: warmshell.Sandbox) -> None:
    # TIOCSTI pushes bytes into the input of the terminal it is called on: inside the sandbox that
    # can only be its own pty (its input comes back as the shell's next line, inside the sandbox).
    sandbox.files.write(
        "/tmp/inject.py",
        "import fcntl, termios\nfor c in b'echo INJ$((6*7))\\n':\n    fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\n",
    )
    with sandbox.pty(["sh"]) as shell:
        shell.send("python3 /tmp/inject.py; echo status=$?\n")
        # The kernel allows it on the caller's own terminal: the injected line is read by the
        # sandbox's shell and runs there (INJ42), nowhere else.
        seen = read_until(shell, rb"INJ42\r\n")
        shell.send("exit\n")
        shell.wait()
    assert b"status=0" in seen
    # Without a terminal there is nothing to inject into: no controlling tty, no /dev/tty.
    r = sandbox.run(
        [
            "python3",
            "-c",
            "import fcntl, os, termios\n"
            "try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('injected')\n"
            "except OSError as e: print('refused', e.errno)\n"
            "try:\n    os.open('/dev/tty', os.O_RDWR); print('tty')\n"
            "except OSError as e: print('no-tty', e.errno)\n",
        ],
        stdin=iter([b""]),
    )
    assert r.stdout.split(b"\n")[:2] == [b"refused 25", b"no-tty 6"], r.stdout


def test_the_async_client_drives_a_pty_and_streams_stdin(gateway: CliGateway) -> None:
    async def main() -> None:
        async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
            sb = await client.create()
            try:
                async with await sb.pty(["sh"], rows=12, columns=34) as shell:
                    await shell.send("stty size; exit 4\n")
                    seen = b""
                    async for event in shell:
                        seen += event.stdout
                    assert shell.exit_code == 4
                    assert b"12 34" in seen

                async def chunks() -> object:
                    for _ in range(10):
                        yield b"y" * 100_000

                r = await sb.run(["wc", "-c"], stdin=chunks())  # type: ignore[arg-type]
                assert r.stdout.strip() == b"1000000"
                events = [e async for e in sb.run_stream(["cat"], stdin=[b"one ", b"two"])]
                assert b"".join(e.stdout for e in events) == b"one two"
                assert events[-1].exit_code == 0
            finally:
                await sb.delete()

    asyncio.run(main())


def test_recv_with_a_timeout_leaves_the_command_running_and_loses_nothing(sandbox: warmshell.Sandbox) -> None:
    with sandbox.start(["cat"]) as cat:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no output within 0\.3 s"):
            cat.recv(timeout=0.3)
        assert time.monotonic() - began >= 0.3
        # The read the timeout left behind gets the next output, for a recv with or without one.
        cat.send(b"one\n")
        first = cat.recv()
        assert first is not None
        assert first.stdout == b"one\n"
        cat.send(b"two\n")
        second = cat.recv(timeout=20)
        assert second is not None
        assert second.stdout == b"two\n"
        cat.close_stdin()
        assert cat.wait() == 0


def test_an_async_recv_under_asyncio_timeout_times_out_the_same_way(gateway: CliGateway) -> None:
    async def main() -> None:
        async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
            sb = await client.create()
            try:
                async with await sb.start(["cat"]) as cat:
                    with pytest.raises(TimeoutError):
                        async with asyncio.timeout(0.3):
                            await cat.recv()
                    # The stream carries on: the read the timeout left behind gets the output.
                    await cat.send(b"one\n")
                    async with asyncio.timeout(20):
                        event = await cat.recv()
                    assert event is not None
                    assert event.stdout == b"one\n"
                    await cat.close_stdin()
                    assert await cat.wait() == 0
            finally:
                await sb.delete()

    asyncio.run(main())


def test_the_gateway_refuses_a_malformed_exec_stream_naming_the_field(
    client: warmshell.Client, sandbox: warmshell.Sandbox
) -> None:
    import grpc

    from warmshell.api.v1 import sandbox_pb2 as pb

    start = pb.ExecStreamRequest(
        start=pb.ExecStreamStart(exec=pb.ExecSandboxRequest(name=sandbox.name, command=["sleep", "30"]))
    )
    tty_start = pb.ExecStreamRequest()
    tty_start.CopyFrom(start)
    tty_start.start.tty = True
    cases = [
        ([pb.ExecStreamRequest(stdin=b"x")], "start"),
        ([start, pb.ExecStreamRequest(signal=0)], "signal"),
        ([start, pb.ExecStreamRequest(signal=99)], "signal"),
        ([start, pb.ExecStreamRequest(resize=pb.TerminalSize(rows=5, columns=5))], "resize"),
        ([tty_start, pb.ExecStreamRequest(resize=pb.TerminalSize(rows=70000, columns=5))], "resize.rows"),
        ([start, start], "start"),
    ]
    for requests, field in cases:

        def hold(messages: list[pb.ExecStreamRequest] = requests) -> Iterator[pb.ExecStreamRequest]:
            yield from messages
            time.sleep(5)  # keep the stream open: the refusal must come from the bad message

        call = client._stub.ExecSandboxStream(hold(), metadata=client._metadata, timeout=20)
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (field, refused.value)
        assert field in (refused.value.details() or ""), (field, refused.value.details())
    # The sandbox still runs commands (nothing was left half-started).
    assert sandbox.run(["true"]).exit_code == 0
