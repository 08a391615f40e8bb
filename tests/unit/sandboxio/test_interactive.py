"""ExecInput: stdin written in order and credited, the end of stdin closing the pipe, input for a
command that closed its stdin discarded (and still credited), resizes and signals that arrive
before the command started; pump_fd reading a terminal to its end (EIO)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import termios

from warmshell.sandboxio.interactive import ExecInput, WindowSize, pump_fd


async def test_stdin_is_written_in_order_credited_and_closed_at_its_end() -> None:
    read_end, write_end = os.pipe()
    credits: list[int] = []
    io = ExecInput(terminal=None, credit=credits.append)
    io.feed(b"first ", credited=False)  # the start request's stdin: not counted against the window
    io.feed(b"second ")
    io.feed(b"third")
    io.end()
    serving = asyncio.create_task(io.serve(write_end, kill=lambda signo: None))
    data = await asyncio.to_thread(_read_all, read_end)
    assert data == b"first second third"  # EOF: the write end was closed at the end of stdin
    assert credits == [7, 5]
    serving.cancel()


async def test_input_for_a_command_that_closed_its_stdin_is_discarded_but_credited() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    credits: list[int] = []
    io = ExecInput(terminal=None, credit=credits.append)
    serving = asyncio.create_task(io.serve(write_end, kill=lambda signo: None))
    io.feed(b"x" * 1000)
    io.feed(b"y" * 10)
    await asyncio.sleep(0.05)
    assert credits == [1000, 10]  # the client is never left waiting for a window
    serving.cancel()


async def test_signals_before_the_start_are_delivered_once_it_runs_and_pipes_ignore_resizes() -> None:
    killed: list[int] = []
    io = ExecInput(terminal=None, credit=lambda size: None)
    io.signal(2)
    io.resize(WindowSize(10, 10))
    read_end, write_end = os.pipe()
    serving = asyncio.create_task(io.serve(write_end, kill=killed.append))
    await asyncio.sleep(0)
    assert killed == [2]
    io.signal(15)
    assert killed == [2, 15]
    serving.cancel()
    os.close(read_end)


async def test_a_terminal_is_resized_and_read_to_its_end() -> None:
    master, slave = os.openpty()
    io = ExecInput(terminal=WindowSize(24, 80), credit=lambda size: None)
    io.resize(WindowSize(42, 99))  # before the start: applied when it starts
    serving = asyncio.create_task(io.serve(master, kill=lambda signo: None))
    await asyncio.sleep(0)
    rows, columns, _, _ = struct.unpack("HHHH", fcntl.ioctl(slave, termios.TIOCGWINSZ, b"\0" * 8))
    assert (rows, columns) == (42, 99)
    io.feed(b"typed\n")
    await asyncio.sleep(0.05)
    assert os.read(slave, 100) == b"typed\n"
    os.write(slave, b"shown")
    os.close(slave)  # the command is gone: the master reads EIO, the end
    seen: list[bytes] = []

    async def sink(stderr: bool, data: bytes) -> None:
        seen.append(data)

    await asyncio.wait_for(pump_fd(master, False, sink, close=False), 5)
    assert b"".join(seen) == b"typed\r\nshown"  # the terminal's echo, then the command's output
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    os.close(master)


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data
