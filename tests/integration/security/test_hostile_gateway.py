"""The SDK's and the CLI's HTTP/2 client against a hostile gateway: a real Unix socket whose
server speaks just enough HTTP/2 to get a request and then answers with what an attacker would
send (a header block that never ends, an HPACK bomb, a response trickled past the deadline,
endless messages for a unary call, settings that would make the client spin, frames too short
for their type, terminal escapes in an error message).

Whoever can put a socket where a user's `WARMSHELL_GATEWAY` points (a shared /tmp, a stale
path) can play this gateway. What each attempt must not win: memory without bound, a call that
outlives its deadline, a hang, an exception outside the SDK's own, or control of the terminal.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import errors
from warmshell.sdk.hpack import encode_headers
from warmshell.sdk.transport import Http2Transport

pytestmark = pytest.mark.timeout(60)

GET = "/warmshell.v1.SandboxService/GetSandbox"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8
OK_HEADERS = encode_headers([(":status", "200"), ("content-type", "application/grpc")])


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def trailers(status: int = 0, text: str = "") -> bytes:
    fields = [("grpc-status", str(status))] + ([("grpc-message", text)] if text else [])
    return frame(HEADERS, END_HEADERS | END_STREAM, 1, encode_headers(fields))


Script = Callable[[socket.socket], None]


class HostileGateway:
    """A Unix socket server: each connection reads the client's preface and first request, then
    runs the script; `sent` counts what the scripts wrote (the client's cost is bounded by it)."""

    def __init__(self, path: Path, script: Script) -> None:
        self.path = path
        self.script = script
        self.sent = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(8)
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            read_request(conn)
            self.script(conn)

    def send(self, conn: socket.socket, data: bytes) -> None:
        if self._stop.is_set():
            raise OSError("stopped")
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def read_request(conn: socket.socket) -> None:
    """The preface, then frames until the request's DATA frame that ends the stream."""
    buffer = b""
    while len(buffer) < 24:
        buffer += conn.recv(65536) or b"x" * 24
    buffer = buffer[24:]
    while True:
        while len(buffer) < 9:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed")
            buffer += chunk
        length = int.from_bytes(buffer[:3], "big")
        kind, flags = buffer[3], buffer[4]
        while len(buffer) < 9 + length:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed")
            buffer += chunk
        buffer = buffer[9 + length :]
        if kind == DATA and flags & END_STREAM:
            return


@contextlib.contextmanager
def hostile(tmp_path: Path, script: Callable[[HostileGateway, socket.socket], None]) -> Iterator[HostileGateway]:
    path = tmp_path / "gateway.sock"
    holder: list[HostileGateway] = []
    server = HostileGateway(path, lambda conn: script(holder[0], conn))
    holder.append(server)
    try:
        yield server
    finally:
        server.close()


def call_in_thread(work: Callable[[], object], within: float) -> tuple[float, object]:
    """Run `work` in a thread; (seconds it took, its result or exception). Fails the test if it
    is still running after `within` seconds (the hostile server is closed by the caller then,
    which frees the thread)."""
    outcome: list[object] = []
    started = time.monotonic()

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # the test inspects whatever it was
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"the call was still running after {within}s"
    return time.monotonic() - started, outcome[0]


def get(path: Path, timeout: float | None) -> Callable[[], object]:
    transport = Http2Transport(f"unix://{path}", path)
    return lambda: transport.unary(GET, pb.SandboxRef(name="x"), pb.Sandbox, metadata=(), timeout=timeout)


def test_a_header_block_that_never_ends_is_refused_at_a_bound(tmp_path: Path) -> None:
    """HEADERS without END_HEADERS, then CONTINUATION frames for ever (the "CONTINUATION
    flood"): the client must stop at a bound, not buffer until it runs out of memory."""

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, frame(HEADERS, 0, 1, OK_HEADERS))
        piece = frame(CONTINUATION, 0, 1, b"\x00\x01a\x7f" + b"b" * 127 + b"\x00" * 16_000)
        while True:
            server.send(conn, piece)

    with hostile(tmp_path, script) as server:
        took, result = call_in_thread(get(server.path, timeout=20), within=15)
    assert isinstance(result, errors.ApiError), result
    assert result.code in ("INTERNAL", "RESOURCE_EXHAUSTED"), result
    assert "header" in result.details, result
    assert took < 10
    assert server.sent < 64 * 2**20, f"the client read {server.sent} bytes of one header block"


def test_an_hpack_bomb_is_refused(tmp_path: Path) -> None:
    """One 4 KiB header put in the dynamic table, then referenced by one byte a hundred thousand
    times: 100 KiB on the wire that decode to 400 MiB of headers."""
    name, value = "x-bomb", "v" * 4000
    added = b"\x40" + encode_headers([(name, value)])[1:]  # literal with incremental indexing
    bomb = added + b"\xbe" * 100_000  # index 62: the newest dynamic entry

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, frame(HEADERS, 0, 1, OK_HEADERS + bomb[:16_000]))
        rest = bomb[16_000:]
        while rest:
            piece, rest = rest[:16_000], rest[16_000:]
            server.send(conn, frame(CONTINUATION, 0 if rest else END_HEADERS, 1, piece))
        server.send(conn, frame(DATA, 0, 1, message(pb.Sandbox(name="x").SerializeToString())))
        server.send(conn, trailers())

    with hostile(tmp_path, script) as server:
        _, result = call_in_thread(get(server.path, timeout=20), within=15)
    assert isinstance(result, errors.ApiError), result
    assert "header" in result.details, result


def test_a_response_trickled_byte_by_byte_still_ends_at_the_deadline(tmp_path: Path) -> None:
    """A frame announced at 1 MiB whose bytes come one at a time, each just before the socket's
    timeout would fire: the call's deadline must still end it."""

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, frame(HEADERS, END_HEADERS, 1, OK_HEADERS))
        server.send(conn, struct.pack(">I", 2**20)[1:] + bytes((DATA, 0)) + struct.pack(">I", 1))
        while True:
            server.send(conn, b"\x00")
            time.sleep(0.05)

    with hostile(tmp_path, script) as server:
        took, result = call_in_thread(get(server.path, timeout=1.0), within=10)
    assert isinstance(result, errors.DeadlineExceeded), result
    assert took < 3, f"a 1 s deadline ended the call after {took:.1f}s"


def test_a_unary_call_answered_with_endless_messages_fails_at_the_second(tmp_path: Path) -> None:
    """A unary answer is one message; a gateway that streams 1 MiB messages for ever must not
    make the client collect them until its deadline (or its memory) runs out."""
    body = message(pb.Sandbox(name="n" * 2**20).SerializeToString())

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, frame(HEADERS, END_HEADERS, 1, OK_HEADERS))
        while True:
            server.send(conn, frame(DATA, 0, 1, body))

    with hostile(tmp_path, script) as server:
        took, result = call_in_thread(get(server.path, timeout=30), within=20)
    assert isinstance(result, errors.ApiError), result
    assert "more than one" in result.details, result
    assert took < 10
    assert server.sent < 256 * 2**20


def test_settings_that_would_stall_or_spin_the_client_are_a_protocol_error(tmp_path: Path) -> None:
    """SETTINGS_MAX_FRAME_SIZE 0 (below the protocol's 16384 floor) would make the next request's
    header block split into empty frames for ever; an initial window past 2^31-1 is as invalid."""
    for setting, value in ((5, 0), (5, 2**24), (4, 2**31)):

        def script(server: HostileGateway, conn: socket.socket, setting: int = setting, value: int = value) -> None:
            server.send(conn, frame(SETTINGS, 0, 0, struct.pack(">HI", setting, value)))
            server.send(conn, frame(HEADERS, END_HEADERS, 1, OK_HEADERS))
            server.send(conn, frame(DATA, 0, 1, message(pb.Sandbox(name="x").SerializeToString())))
            server.send(conn, trailers())
            while conn.recv(65536):  # a second call on this connection would start here
                pass

        with hostile(tmp_path, script) as server:
            call = get(server.path, timeout=3)

            def twice(call: Callable[[], object] = call) -> object:
                outcomes = []
                for _ in range(2):
                    try:
                        outcomes.append(call())
                    except errors.ApiError as exc:
                        outcomes.append(exc)
                return outcomes

            _, result = call_in_thread(twice, within=10)
        assert isinstance(result, list), result
        first = result[0]
        assert isinstance(first, errors.ApiError), (setting, value, first)
        assert "SETTINGS" in first.details, first
        (tmp_path / "gateway.sock").unlink()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(frame(WINDOW_UPDATE, 0, 0), id="empty WINDOW_UPDATE on the connection"),
        pytest.param(frame(WINDOW_UPDATE, 0, 1, b"\x00"), id="short WINDOW_UPDATE on the stream"),
        pytest.param(frame(RST_STREAM, 0, 1, b"\x00\x00"), id="short RST_STREAM"),
        pytest.param(frame(GOAWAY, 0, 0, b"\x00"), id="short GOAWAY"),
        pytest.param(frame(PING, 0, 0, b"\x00"), id="short PING"),
        pytest.param(frame(SETTINGS, 0, 0, b"\x00\x05\x00"), id="SETTINGS not a multiple of 6"),
        pytest.param(frame(DATA, PADDED, 1), id="padded DATA without its pad length"),
        pytest.param(frame(DATA, PADDED, 1, b"\x09abc"), id="padding longer than the frame"),
        pytest.param(frame(HEADERS, END_HEADERS | PADDED, 1), id="padded HEADERS without its pad length"),
        pytest.param(frame(HEADERS, END_HEADERS | 0x20, 1, b"\x00\x00"), id="HEADERS with a cut priority"),
        pytest.param(frame(HEADERS, END_HEADERS, 1, b"\x7f"), id="a header index cut short"),
    ],
)
def test_frames_too_short_for_their_type_fail_as_sdk_errors(tmp_path: Path, bad: bytes) -> None:
    """Each is a protocol error: the call fails with an SDK ApiError at once (not a struct.error
    or IndexError from deep inside the client, and not a wait until the deadline)."""
    prefix = b"" if bad[3] == HEADERS else frame(HEADERS, END_HEADERS, 1, OK_HEADERS)

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, prefix + bad)
        while conn.recv(65536):
            pass

    with hostile(tmp_path, script) as server:
        took, result = call_in_thread(get(server.path, timeout=20), within=15)
    assert isinstance(result, errors.ApiError), repr(result)
    assert took < 5


def test_the_cli_shows_a_hostile_error_message_without_its_terminal_escapes(tmp_path: Path) -> None:
    """A gateway's error text reaches the user's terminal: escapes in it (a title change, a
    cursor move, an OSC 52 clipboard write) must be shown inert, and a 100 KiB message cut short."""
    evil = "\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZWNobyBvd25lZA==\x07" + "\x9b31m" + "x" * 100_000

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, frame(HEADERS, END_HEADERS | END_STREAM, 1, _trailers_only(evil)))

    with hostile(tmp_path, script) as server:
        env = os.environ | {"WARMSHELL_GATEWAY": f"unix://{server.path}", "WARMSHELL_API_TOKEN": "t", "COLUMNS": "200"}
        done = subprocess.run(
            [sys.executable, "-m", "warmshell", "sandbox", "get", "x"],
            capture_output=True,
            env=env,
            timeout=30,
            check=False,
        )
    shown = done.stdout + done.stderr
    assert done.returncode != 0
    for control in (b"\x1b", b"\x07", "\x9b".encode()):
        assert control not in shown, shown[:400]
    assert b"\\x1b]0;owned\\x07" in shown, shown[:400]  # shown, as its escapes
    assert len(shown) < 16 * 1024, f"{len(shown)} bytes of error shown"


def _trailers_only(text: str) -> bytes:
    """A trailers-only answer (:status, content-type and the status in one HEADERS frame)."""
    return encode_headers(
        [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "13"), ("grpc-message", text)]
    )


def test_the_cli_renders_a_hostile_sandbox_without_its_terminal_escapes(tmp_path: Path) -> None:
    """Names, ids and condition texts in a gateway's answer are rendered by `sandbox get`: the
    same escapes hidden in them are shown inert too."""
    sandbox = pb.Sandbox(name="x\x1b[31m", id="i\x1b]0;owned\x07")
    sandbox.status.conditions.add(type="Ready\x1b[5m", reason="R\x9b1m", message="\x1b]52;c;ZWNobw==\x07")
    answer = frame(DATA, 0, 1, message(sandbox.SerializeToString()))

    def script(server: HostileGateway, conn: socket.socket) -> None:
        server.send(conn, frame(HEADERS, END_HEADERS, 1, OK_HEADERS) + answer + trailers())

    with hostile(tmp_path, script) as server:
        env = os.environ | {"WARMSHELL_GATEWAY": f"unix://{server.path}", "WARMSHELL_API_TOKEN": "t"}
        done = subprocess.run(
            [sys.executable, "-m", "warmshell", "sandbox", "get", "x"],
            capture_output=True,
            env=env,
            timeout=30,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    for control in (b"\x1b", b"\x07", "\x9b".encode()):
        assert control not in done.stdout, done.stdout
    assert b"i\\x1b]0;owned\\x07" in done.stdout, done.stdout
