"""The byte stream's kernel moves (`drivers/local/runtime/socketio.py`) on real socket pairs and
files: exact sizes, a peer that stops early or sends more, a silent peer, frames."""

from __future__ import annotations

import io
import os
import socket
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmshell.core.transfers import FRAME_END
from warmshell.drivers.local.runtime import socketio


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)  # as the event loop leaves a connection
    return ours, theirs


def _send_then_close(sock: socket.socket, data: bytes) -> threading.Thread:
    def run() -> None:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@settings(max_examples=20, deadline=None)
@given(size=st.integers(min_value=0, max_value=3 * 1024 * 1024))
def test_exactly_the_size_lands_in_the_file(size: int) -> None:
    data = os.urandom(size)
    ours, theirs = _pair()
    with ours, theirs, tempfile.TemporaryFile() as target:
        sender = _send_then_close(theirs, data)
        assert socketio.receive_into(ours.fileno(), target.fileno(), size, 5.0) == size
        sender.join()
        target.seek(0)
        assert target.read() == data


def test_fewer_or_more_bytes_than_announced_are_refused() -> None:
    for sent, error in ((b"x" * 10, socketio.EndedEarly), (b"x" * 30, socketio.TooMany)):
        ours, theirs = _pair()
        with ours, theirs, tempfile.TemporaryFile() as target:
            sender = _send_then_close(theirs, sent)
            with pytest.raises(error):
                socketio.receive_into(ours.fileno(), target.fileno(), 20, 5.0)
            sender.join()


def test_a_silent_peer_times_out() -> None:
    ours, theirs = _pair()
    with ours, theirs, tempfile.TemporaryFile() as target, pytest.raises(TimeoutError):
        socketio.receive_into(ours.fileno(), target.fileno(), 20, 0.2)
    ours, theirs = _pair()
    with ours, theirs, pytest.raises(TimeoutError):
        socketio.SocketReader(ours.fileno(), 20, 0.2).read(5)


def test_the_reader_reads_forward_and_wants_the_end_after_its_size() -> None:
    ours, theirs = _pair()
    with ours, theirs:
        sender = _send_then_close(theirs, bytes(range(100)))
        reader = socketio.SocketReader(ours.fileno(), 100, 5.0)
        assert reader.read(10) == bytes(range(10))
        assert reader.seek(50) == 50
        with pytest.raises(OSError, match="forward only"):
            reader.seek(10)
        assert reader.read(5) == bytes(range(50, 55))
        reader.finish()
        assert reader.tell() == 100
        sender.join()


def test_frames_carry_the_chunks_and_end_with_the_end_frame() -> None:
    ours, theirs = _pair()
    chunks = [b"a" * 5, b"", b"b" * 70_000]
    with ours, theirs:
        received = io.BytesIO()

        def collect() -> None:
            while data := theirs.recv(65536):
                received.write(data)

        collector = threading.Thread(target=collect)
        collector.start()
        assert socketio.send_frames(ours.fileno(), iter(chunks), 5.0) == 70_005
        ours.shutdown(socket.SHUT_WR)
        collector.join()
    body = received.getvalue()
    expected = b"".join(len(c).to_bytes(8, "big") + c for c in chunks if c) + FRAME_END
    assert body == expected


def test_sendfile_sends_up_to_the_size_from_the_start() -> None:
    ours, theirs = _pair()
    with ours, theirs, tempfile.TemporaryFile() as source:
        source.write(b"0123456789")
        source.flush()
        assert socketio.send_from(ours.fileno(), source.fileno(), 6, 5.0) == 6
        assert theirs.recv(100) == b"012345"
        assert socketio.send_from(ours.fileno(), source.fileno(), 50, 5.0) == 10  # it shrank: fewer
