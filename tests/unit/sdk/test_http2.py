"""The HTTP/2 gRPC client against a scripted peer on a socketpair: how each way a call can end
is read (trailers, trailers-only, HTTP errors, resets, GOAWAY, a closed connection, a deadline),
and what it answers on its own (SETTINGS and PING acknowledgements)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from warmshell.sdk import http2
from warmshell.sdk.hpack import encode_headers

OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def headers(fields: list[tuple[str, str]], *, end: bool = False, stream: int = 1) -> bytes:
    return _frame(1, 0x4 | (0x1 if end else 0), stream, encode_headers(fields))


def data(payload: bytes, *, end: bool = False, stream: int = 1) -> bytes:
    return _frame(0, 0x1 if end else 0, stream, payload)


def message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


class Peer:
    """The server end: writes a script, and records the frames the client sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames: list[tuple[int, int, int, bytes]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := self.sock.recv(65536):
                buffer += chunk
                if buffer.startswith(b"PRI * HTTP/2.0"):
                    buffer = buffer[24:]
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    length = int.from_bytes(buffer[:3], "big")
                    stream = struct.unpack(">I", buffer[5:9])[0]
                    self.frames.append((buffer[3], buffer[4], stream, buffer[9 : 9 + length]))
                    buffer = buffer[9 + length :]
        except OSError:
            pass

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))


@pytest.fixture
def pair() -> Iterator[tuple[http2.Connection, Peer]]:
    client_end, server_end = socket.socketpair()
    client_end.settimeout(5)
    peer = Peer(server_end)
    conn = http2.Connection(client_end)
    yield conn, peer
    conn.close()
    server_end.close()


def _call(conn: http2.Connection, *, deadline: float | None = None) -> list[bytes]:
    return list(conn.start("/svc/Method", b"request", [("authorization", "Bearer t")], deadline=deadline))


def test_messages_split_across_frames_then_ok_trailers(pair: tuple[http2.Connection, Peer]) -> None:
    conn, peer = pair
    stream = message(b"first") + message(b"") + message(b"x" * 70_000)
    peer.send(
        _frame(4, 0, 0, struct.pack(">HI", 5, 1 << 20)),  # SETTINGS: a larger max frame size
        headers(OK_HEADERS),
        data(stream[:3]),
        data(stream[3:20]),
        data(stream[20:]),
        headers([("grpc-status", "0")], end=True),
    )
    assert _call(conn) == [b"first", b"", b"x" * 70_000]
    assert conn.usable
    time.sleep(0.1)
    kinds = [(kind, flags) for kind, flags, _, _ in peer.frames]
    assert (4, 1) in kinds  # our SETTINGS acknowledged theirs
    sent = {name: value for kind, _, _, block in peer.frames if kind == 1 for name, value in _decode(block)}
    assert sent[":path"] == "/svc/Method"
    assert sent["authorization"] == "Bearer t"
    assert sent["te"] == "trailers"


def _decode(block: bytes) -> list[tuple[str, str]]:
    from warmshell.sdk.hpack import HeaderDecoder

    return HeaderDecoder().decode(block)


def test_a_trailers_only_failure_carries_the_decoded_message(pair: tuple[http2.Connection, Peer]) -> None:
    conn, peer = pair
    peer.send(headers([*OK_HEADERS, ("grpc-status", "5"), ("grpc-message", "caf%C3%A9 %25 gone")], end=True))
    with pytest.raises(http2.GrpcFailure) as failed:
        _call(conn)
    assert (failed.value.code, failed.value.message) == ("NOT_FOUND", "café % gone")
    assert conn.usable  # a clean failure: the connection can carry the next call


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([headers([(":status", "503")], end=True)], "UNAVAILABLE"),
        ([headers([(":status", "200"), ("content-type", "text/html")], end=True)], "UNKNOWN"),
        ([headers(OK_HEADERS), _frame(3, 0, 1, struct.pack(">I", 8))], "CANCELLED"),  # RST_STREAM
        ([_frame(7, 0, 0, struct.pack(">II", 0, 0))], "UNAVAILABLE"),  # GOAWAY before our stream
        ([headers(OK_HEADERS), data(message(b"partial"), end=True)], "UNKNOWN"),  # no grpc-status
        ([headers(OK_HEADERS), data(b"\x00" + struct.pack(">I", 32 * 1024 * 1024))], "RESOURCE_EXHAUSTED"),
        ([headers(OK_HEADERS), data(b"\x01" + struct.pack(">I", 1) + b"z")], "INTERNAL"),  # compressed
    ],
)
def test_each_way_a_call_can_fail(pair: tuple[http2.Connection, Peer], frames: list[bytes], code: str) -> None:
    conn, peer = pair
    peer.send(*frames)
    with pytest.raises(http2.GrpcFailure) as failed:
        _call(conn)
    assert failed.value.code == code


def test_a_ping_is_answered_and_a_closed_connection_is_unavailable(pair: tuple[http2.Connection, Peer]) -> None:
    conn, peer = pair
    peer.send(_frame(6, 0, 0, b"12345678"), headers(OK_HEADERS))
    call = conn.start("/svc/Method", b"", [], deadline=time.monotonic() + 10)
    call._step()  # the PING
    call._step()  # the response headers
    deadline = time.monotonic() + 5
    while not any(kind == 6 and flags == 1 for kind, flags, _, _ in peer.frames):
        assert time.monotonic() < deadline, peer.frames
        time.sleep(0.01)
    assert [p for kind, flags, _, p in peer.frames if kind == 6] == [b"12345678"]
    peer.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(http2.GrpcFailure) as failed:
        list(call)
    assert failed.value.code == "UNAVAILABLE"
    assert not conn.usable


def test_a_deadline_cancels_the_stream(pair: tuple[http2.Connection, Peer]) -> None:
    conn, peer = pair
    peer.send(headers(OK_HEADERS))  # and then nothing
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _call(conn, deadline=time.monotonic() + 0.2)
    assert time.monotonic() - started < 3
    time.sleep(0.1)
    assert any(kind == 3 for kind, _, _, _ in peer.frames)  # RST_STREAM sent
    sent = {name: value for kind, _, _, block in peer.frames if kind == 1 for name, value in _decode(block)}
    assert sent["grpc-timeout"].endswith("m")
    assert not conn.usable


def test_grpc_timeout_fits_eight_digits() -> None:
    assert http2.grpc_timeout(0.0001) == "1m"
    assert http2.grpc_timeout(1.5) == "1500m"
    assert http2.grpc_timeout(10**9) == "99999999S"
