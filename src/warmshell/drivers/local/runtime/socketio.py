"""A file's bytes moved between a socket and a file descriptor in the kernel, in one thread:
`splice(2)` from the socket through a pipe into the file for an upload, `sendfile(2)` for a
download; an uploaded tar read by `SocketReader` (its members' content spliced the same way),
a downloaded one sent in frames (`send_frames`). Python touches no byte of a file, and the
event loop no chunk: through gRPC's messages a
5 MiB write cost the gateway about 10 ms of CPU, most of it copies and the wakes between the
poller, the loop and the writer threads per 256 KiB message.

The socket stays non-blocking (the event loop owns it): a call that would block waits in
`poll` for at most `idle_seconds`, then raises TimeoutError. Shutting the socket down from
another thread wakes the wait (a cancelled transfer).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
from collections.abc import Iterator

from warmshell.core.transfers import FRAME_END, FRAME_HEADER_BYTES
from warmshell.sandboxio.archive import forward_target

__all__ = ["EndedEarly", "SocketReader", "TooMany", "receive_into", "send_frames", "send_from"]

PIPE_BYTES = 1024 * 1024  # /proc/sys/fs/pipe-max-size's default: what an unprivileged pipe may hold
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class EndedEarly(Exception):
    """The peer closed before the bytes announced (`received` of them came)."""

    def __init__(self, received: int) -> None:
        super().__init__(f"ended after {received} bytes")
        self.received = received


class TooMany(Exception):
    """More bytes followed the ones announced."""


def _wait(fd: int, events: int, idle_seconds: float) -> None:
    poller = select.poll()
    poller.register(fd, events)
    if not poller.poll(int(idle_seconds * 1000)):
        raise TimeoutError(f"no progress for {idle_seconds:g}s")


def _drain_pipe(pipe: int, fd: int, count: int) -> None:
    """Move `count` bytes the pipe holds into `fd` (splice; read and write where the file
    system takes no splice)."""
    while count:
        try:
            moved = os.splice(pipe, fd, count)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            data = os.read(pipe, count)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            moved = len(data)
        count -= moved


def _expect_end(sock: int, idle_seconds: float) -> None:
    """The stream's end, and nothing before it."""
    while True:
        _wait(sock, select.POLLIN | select.POLLRDHUP, idle_seconds)
        try:
            if os.read(sock, 1):
                raise TooMany()
            return
        except BlockingIOError:
            continue


class SocketReader:
    """Exactly `size` bytes of a socket as a forward-only file (what tarfile reads: read, tell,
    a forward seek): EndedEarly at an end before them; `finish` drops what the reader left
    (a tar's end padding) and wants the end of the stream next."""

    def __init__(self, sock: int, size: int, idle_seconds: float) -> None:
        self._sock = sock
        self._left = size
        self._position = 0
        self._idle_seconds = idle_seconds

    def read(self, size: int = -1) -> bytes:
        """`size` bytes (the rest when negative), fewer only at the announced end."""
        wanted = self._left if size < 0 else min(size, self._left)
        pieces: list[bytes] = []
        got = 0
        while got < wanted:
            try:
                data = os.read(self._sock, wanted - got)
            except BlockingIOError:
                _wait(self._sock, select.POLLIN, self._idle_seconds)
                continue
            if not data:
                raise EndedEarly(self._position + got)
            pieces.append(data)
            got += len(data)
        self._position += got
        self._left -= got
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def copy_into(self, fd: int, count: int) -> None:
        """The next `count` bytes into `fd`, in the kernel (a member's content: tarfile never
        sees it)."""
        count = min(count, self._left)
        moved = _splice_into(self._sock, fd, count, self._idle_seconds)
        self._position += moved
        self._left -= moved
        if moved < count:
            raise EndedEarly(self._position)

    def tell(self) -> int:
        """Bytes read so far."""
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Forward only: the bytes between are read and dropped."""
        target = forward_target(self._position, offset, whence)
        while self._position < target:
            self.read(min(target - self._position, PIPE_BYTES))
        return self._position

    def finish(self) -> None:
        """Drop the rest of the announced bytes, then expect the end of the stream."""
        while self._left:
            self.read(min(self._left, PIPE_BYTES))
        _expect_end(self._sock, self._idle_seconds)


def _splice_into(sock: int, fd: int, count: int, idle_seconds: float) -> int:
    """Up to `count` bytes from `sock` into `fd` through a pipe; fewer only at the socket's end."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # a lower pipe-max-size: the default pipe, more splices
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_BYTES)
        left = count
        while left:
            try:
                moved = os.splice(sock, write_end, min(left, PIPE_BYTES), flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                _wait(sock, select.POLLIN, idle_seconds)
                continue
            if moved == 0:
                break
            _drain_pipe(read_end, fd, moved)
            left -= moved
        return count - left
    finally:
        os.close(read_end)
        os.close(write_end)


def receive_into(sock: int, fd: int, size: int, idle_seconds: float) -> int:
    """Exactly `size` bytes from `sock` into `fd`, then the socket's end; EndedEarly or TooMany
    otherwise (what was written is then the caller's to discard)."""
    if (moved := _splice_into(sock, fd, size, idle_seconds)) < size:
        raise EndedEarly(moved)
    _expect_end(sock, idle_seconds)
    return size


def send_from(sock: int, fd: int, size: int, idle_seconds: float) -> int:
    """Up to `size` bytes of `fd` from its start into `sock`; the bytes sent (fewer: the file
    shrank meanwhile)."""
    offset = 0
    while offset < size:
        try:
            sent = os.sendfile(sock, fd, offset, size - offset)
        except BlockingIOError:
            _wait(sock, select.POLLOUT, idle_seconds)
            continue
        if sent == 0:
            break
        offset += sent
    return offset


def _send_all(sock: int, pieces: list[bytes], idle_seconds: float) -> None:
    views = [memoryview(piece) for piece in pieces if piece]
    while views:
        try:
            sent = os.writev(sock, views)
        except BlockingIOError:
            _wait(sock, select.POLLOUT, idle_seconds)
            continue
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][sent:]


def send_frames(sock: int, chunks: Iterator[bytes], idle_seconds: float) -> int:
    """Each chunk as a frame (its length, 8 bytes big-endian, then its bytes), then the end
    frame; the chunks' bytes sent."""
    total = 0
    for chunk in chunks:
        if not chunk:
            continue  # a frame of length 0 is the end frame
        _send_all(sock, [len(chunk).to_bytes(FRAME_HEADER_BYTES, "big"), chunk], idle_seconds)
        total += len(chunk)
    _send_all(sock, [FRAME_END], idle_seconds)
    return total
