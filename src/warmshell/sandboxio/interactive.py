"""The live input side of one exec: streamed stdin, terminal resizes and signals, as they arrive
on the supervisor's session, fed to the command by whichever runner started it.

The session hands each message to the exec's `ExecInput`; the runner calls `serve` with the fd
the command reads (a pipe, or a pseudo-terminal's master) and a way to signal its process group.
Input is written as fast as the command takes it and no faster: each chunk written is credited
back to the gateway, which sends no more than its window ahead, so a command that reads slowly
holds the client's upload back rather than anyone buffering it. The fd helpers here (a
non-blocking read loop that treats a terminal's EIO as its end, the terminal's size) are shared by
the in-process runner and the local driver's agent link.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import struct
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_SIZE", "ExecInput", "WindowSize", "pump_fd", "set_window_size"]

READ_CHUNK = 64 * 1024
# (is_stderr, data), as `processes.OutputSink`.
Sink = Callable[[bool, bytes], Awaitable[None]]


@dataclass(frozen=True)
class WindowSize:
    """A terminal's size in character cells."""

    rows: int
    columns: int


DEFAULT_SIZE = WindowSize(24, 80)


class ExecInput:
    """Input for one exec. `terminal` is the size to open a pseudo-terminal with, or None for
    plain pipes. Stdin is queued in arrival order; resizes and signals take effect at once (a
    Ctrl-C must not wait behind stdin the command is not reading), or as soon as it started."""

    def __init__(self, *, terminal: WindowSize | None, credit: Callable[[int], None]) -> None:
        self.terminal = terminal
        self._credit = credit
        self._queue: asyncio.Queue[tuple[bytes, bool] | None] = asyncio.Queue()  # None: the end
        self._early: list[WindowSize | int] = []  # resizes and signals before `serve`
        self._fd = -1
        self._kill: Callable[[int], object] | None = None

    def feed(self, data: bytes, *, credited: bool = True) -> None:
        """More stdin; `credited`: the gateway counts it against its window (the first request's
        `stdin` is not)."""
        if data:
            self._queue.put_nowait((data, credited))

    def end(self) -> None:
        """The end of stdin."""
        self._queue.put_nowait(None)

    def resize(self, size: WindowSize) -> None:
        """The client's terminal changed size (ignored without a terminal)."""
        if self.terminal is None:
            return
        if self._fd < 0:
            self._early.append(size)
        else:
            set_window_size(self._fd, size)

    def signal(self, signo: int) -> None:
        """Deliver `signo` to the command's process group."""
        if self._kill is None:
            self._early.append(signo)
        else:
            self._kill(signo)

    async def serve(self, fd: int, *, kill: Callable[[int], object]) -> None:
        """Feed the running command until cancelled: write stdin to `fd` in order (closed at the
        end of stdin unless it is a terminal, which stays open for the command's output), resize
        the terminal, signal through `kill(signo)`. Takes ownership of `fd` when it is a pipe; a
        terminal's master belongs to the runner."""
        self._fd, self._kill = fd, kill
        for early in self._early:
            self.resize(early) if isinstance(early, WindowSize) else self.signal(early)
        self._early.clear()
        writable = fd
        try:
            while True:
                item = await self._queue.get()
                if item is not None:
                    data, credited = item
                    if writable >= 0:
                        writable = await _write(writable, data, close=self.terminal is None)
                    if credited:  # written, or discarded once the command closed its stdin
                        self._credit(len(data))
                elif self.terminal is None and writable >= 0:
                    os.close(writable)
                    writable = -1
        finally:
            self._fd, self._kill = -1, None
            if self.terminal is None and writable >= 0:
                os.close(writable)


async def write_stdin(fd: int, data: bytes) -> None:
    """Write all of `data` to the pipe `fd`, then close it (EOF), on the event loop rather than
    in a thread: cancelled (the command exited while a process it left holds its stdin unread)
    it stops and closes `fd` too, holding nothing. A reader that went away ends it early."""
    try:
        fd = await _write(fd, data, close=True)
    except OSError:
        pass  # the pipe cannot take it: the command reads EOF
    finally:
        if fd >= 0:
            os.close(fd)


async def _write(fd: int, data: bytes, *, close: bool) -> int:
    """Write all of `data` to a non-blocking `fd`, waiting while it is full; the fd, or -1 once
    the reader has gone (closed here when `close`: the rest of stdin is then discarded)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await _ready(fd, write=True)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EIO):
                raise
            if close:
                os.close(fd)
            return -1
    return fd


async def pump_fd(
    fd: int, stderr: bool, sink: Sink, *, close: bool = True, ended: asyncio.Future[Any] | None = None
) -> None:
    """Read `fd` to its end into `sink`, then close it (unless not `close`). A terminal's master
    reports its end (every holder of the slave closed it) as EIO rather than an empty read. The
    loop watches the fd directly: cheaper per exec than a transport and a stream reader.

    `ended`, done once the command exited: the exec then ends with it rather than when every
    holder of the fd closed it (`sleep 100 &` keeps stdout open): what was queued in the fd at
    that moment, which is everything the command wrote, is still read, and nothing after."""
    os.set_blocking(fd, False)
    left: int | None = None  # bytes still to read once the command ended
    settle = os.isatty(fd)
    try:
        while True:
            if left is None and ended is not None and ended.done():
                left = _queued(fd)
            if left == 0:
                if not settle:
                    return
                # A terminal passes what the command wrote on to its master in a kernel work
                # item, so its last output may not be counted yet: wait for it once, briefly.
                settle = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_ready(fd, write=False), _TERMINAL_SETTLE_SECONDS)
                left = _queued(fd)
                continue
            try:
                data = os.read(fd, READ_CHUNK if left is None else min(left, READ_CHUNK))
            except BlockingIOError:
                await _ready(fd, write=False, unless=ended if left is None else None)
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:
                    return
                raise
            if not data:
                return
            if left is not None:
                left -= len(data)
            await sink(stderr, data)
    finally:
        if close:
            os.close(fd)


_TERMINAL_SETTLE_SECONDS = 0.05


def _queued(fd: int) -> int:
    """How many bytes wait in `fd` (a pipe, or a terminal's master) to be read."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0  # a terminal every holder of whose slave has closed it: nothing more comes


def set_window_size(fd: int, size: WindowSize) -> None:
    """TIOCSWINSZ on a terminal (the kernel then sends SIGWINCH to its foreground group)."""
    with contextlib.suppress(OSError):  # the terminal is already gone
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.columns, 0, 0))


async def _ready(fd: int, *, write: bool, unless: asyncio.Future[Any] | None = None) -> None:
    """Until the event loop sees `fd` writable (or readable), or `unless` is done."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    (loop.add_writer if write else loop.add_reader)(fd, _resolve, ready)

    def stop(_: object) -> None:
        _resolve(ready)

    if unless is not None:
        unless.add_done_callback(stop)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)
        if unless is not None:
            unless.remove_done_callback(stop)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
