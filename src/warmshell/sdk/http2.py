"""A small gRPC client over HTTP/2 on a Unix socket, for unary and server-streaming calls: what
the CLI and the SDK's `http2` transport send to a local gateway (which stays grpcio).

Why it exists: `import grpc` costs 60-90 ms on the machines warmshell runs on, most of a CLI
call's 100 ms budget; this module and its HPACK half import in about a millisecond (the `h2`
package would cost 50 ms). It speaks the gRPC-over-HTTP/2 wire format as specified
(PROTOCOL-HTTP2 in the grpc repository): a POST with `content-type: application/grpc` and
`te: trailers`, each message behind a 5-byte prefix (compressed flag, big-endian length), the
outcome in the trailers (`grpc-status`, percent-encoded `grpc-message`).

One call at a time per connection, blocking sockets, no compression, no client streaming; a
connection that saw anything unusual (a cancel, a GOAWAY, a timeout) is closed, not reused.
Failures are `GrpcFailure`s carrying the gRPC status number; the transport maps them to SDK
exceptions.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator, Sequence
from urllib.parse import unquote

from warmshell.sdk.hpack import HeaderDecoder, HpackError, encode_headers

__all__ = [
    "KEEPALIVE_SECONDS",
    "KEEPALIVE_TIMEOUT_SECONDS",
    "MAX_RECEIVE_MESSAGE_BYTES",
    "STATUS_NAMES",
    "Call",
    "Connection",
    "GrpcFailure",
    "connect_unix",
    "grpc_timeout",
]

# What grpc status numbers mean (the numbering is part of the gRPC protocol).
STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
_CANCELLED, _UNKNOWN, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNIMPLEMENTED = 1, 2, 4, 8, 12
_INTERNAL, _UNAVAILABLE, _PERMISSION_DENIED, _UNAUTHENTICATED = 13, 14, 7, 16

# A call that has heard nothing from the gateway for KEEPALIVE_SECONDS sends a PING; one not
# answered within KEEPALIVE_TIMEOUT_SECONDS fails the call as Unavailable. Without it a stream on
# a gateway that stopped (SIGSTOP, a hang, a host gone without closing the socket) waits for ever:
# a silent command may run for hours, so silence alone says nothing. Both clients (this one and
# grpcio, see transport.CHANNEL_OPTIONS) fail such a call within the sum, 20 s; the gateway
# accepts a PING every 5 s (gateway.listening) so that a long silent call is never told off.
KEEPALIVE_SECONDS = 10.0
KEEPALIVE_TIMEOUT_SECONDS = 10.0
# As the grpcio client is configured (sdk.client.CHANNEL_OPTIONS): the gateway sends up to 16 MiB.
MAX_RECEIVE_MESSAGE_BYTES = 16 * 1024 * 1024
# A header block, compressed or decoded (RFC 7541's size: name + value + 32 per field). The
# gateway's are a few hundred bytes; grpc's own hard limit is 16 KiB. Without a bound a peer
# could send CONTINUATION frames, or one-byte references to a 4 KiB table entry, for ever.
MAX_HEADER_LIST_BYTES = 256 * 1024

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE = range(9)
_CONTINUATION = 9
_END_STREAM = _ACK = 0x1
_END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x4, 0x8, 0x20
_SETTINGS_ENABLE_PUSH, _SETTINGS_INITIAL_WINDOW, _SETTINGS_MAX_FRAME = 2, 4, 5
_DEFAULT_WINDOW = 65_535
_MAX_WINDOW = 2**31 - 1
_MIN_FRAME = 16_384  # RFC 9113 6.5.2: SETTINGS_MAX_FRAME_SIZE lies in [2^14, 2^24 - 1]
_OUR_MAX_FRAME = 2**24 - 1  # the largest the protocol allows: fewer frames for big answers
# Our receive windows start at the maximum and are topped up once this much has been read.
_REPLENISH_AFTER = 2**30
_HEADER = struct.Struct(">I")  # frames: 24-bit length, type, flags, 31-bit stream id
_RST_CODES = {0x7: _UNAVAILABLE, 0x8: _CANCELLED, 0xB: _RESOURCE_EXHAUSTED, 0xC: _PERMISSION_DENIED}
_HTTP_STATUS_CODES = {400: _INTERNAL, 401: _UNAUTHENTICATED, 403: _PERMISSION_DENIED, 404: _UNIMPLEMENTED}


# What a peer may send on an idle connection without a call in flight.
_UPKEEP = frozenset({_SETTINGS, _PING, _WINDOW_UPDATE})
# Payload sizes RFC 9113 fixes for these frame types (anything else is a FRAME_SIZE_ERROR).
_EXACT_LENGTHS = {_RST_STREAM: 4, _PING: 8, _WINDOW_UPDATE: 4, _PRIORITY: 5}


class GrpcFailure(Exception):
    """A call that ended with a non-OK gRPC status (or could not be made: UNAVAILABLE)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{STATUS_NAMES[status] if status < len(STATUS_NAMES) else status}: {message}")
        self.status = status
        self.message = message

    @property
    def code(self) -> str:
        """The status name, e.g. "NOT_FOUND" (UNKNOWN for numbers outside the protocol)."""
        return STATUS_NAMES[self.status] if 0 <= self.status < len(STATUS_NAMES) else "UNKNOWN"


def grpc_timeout(seconds: float) -> str:
    """The `grpc-timeout` header for a deadline `seconds` away (at most 8 digits and a unit)."""
    millis = max(1, int(seconds * 1000 + 0.999))
    return f"{millis}m" if millis < 100_000_000 else f"{min(int(seconds) + 1, 99_999_999)}S"


def connect_unix(path: str, timeout: float | None) -> socket.socket:
    """A connected stream socket to `path`; FileNotFoundError when there is no socket there,
    other OSErrors (refused, ...) as raised."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(len(payload))[1:] + bytes((kind, flags)) + _HEADER.pack(stream) + payload


class Connection:
    """One HTTP/2 connection to a gRPC server; runs one `Call` at a time."""

    def __init__(self, sock: socket.socket, *, authority: str = "localhost") -> None:
        self._sock = sock
        self._authority = authority
        self._buffer = bytearray()
        self._decoder = HeaderDecoder(max_list_size=MAX_HEADER_LIST_BYTES)
        self._next_stream = 1
        self._peer_max_frame = 16_384
        self._peer_initial_window = _DEFAULT_WINDOW
        self._send_window = _DEFAULT_WINDOW  # the connection's, for our DATA
        self._received = 0  # DATA octets since we last topped up the connection window
        self.window_delta = 0  # changes of the peer's initial window an open stream has not applied
        self.goaway_last_stream: int | None = None
        self.usable = True  # False once anything makes reuse unsafe
        self._deadline: float | None = None
        self._pinged = False  # a keepalive PING is unanswered
        settings = struct.pack(
            ">HIHIHI",
            _SETTINGS_ENABLE_PUSH,
            0,
            _SETTINGS_INITIAL_WINDOW,
            _MAX_WINDOW,
            _SETTINGS_MAX_FRAME,
            _OUR_MAX_FRAME,
        )
        grow = struct.pack(">I", _MAX_WINDOW - _DEFAULT_WINDOW)
        self._send(_PREFACE + _frame(_SETTINGS, 0, 0, settings) + _frame(_WINDOW_UPDATE, 0, 0, grow))

    def close(self) -> None:
        """Drop the connection (idempotent)."""
        self.usable = False
        self._sock.close()

    def fileno(self) -> int:
        """The socket's descriptor (-1 once closed), to wait on it."""
        return self._sock.fileno()

    def idle_and_open(self) -> bool:
        """Whether this idle connection can carry a new call: still usable, and since its last
        call the peer has neither closed it nor sent anything but connection upkeep. A server
        may follow a response with a WINDOW_UPDATE, a PING or SETTINGS (grpc does, depending on
        timing): those are handled here as a call would; anything else (a GOAWAY, a partial
        frame, data) means the connection is not reused."""
        if not self.usable:
            return False
        try:
            self._sock.setblocking(False)  # the next call sets its own deadline
            # One read: upkeep is a few frames of a few bytes, and a peer that has more to say
            # than that is not quiet (nor can it keep this loop reading).
            chunk = self._sock.recv(65_536)
            if not chunk:
                return False  # closed by the peer
            self._buffer += chunk
        except BlockingIOError:
            pass  # nothing more was sent
        except OSError:
            return False
        try:
            while self._buffer:
                if len(self._buffer) < 9 or len(self._buffer) < 9 + int.from_bytes(self._buffer[:3], "big"):
                    return False  # a partial frame: reading the rest would wait on the peer
                kind, flags, stream, payload = self.read_frame()
                if kind not in _UPKEEP or (stream != 0 and kind != _WINDOW_UPDATE):
                    return False
                if stream == 0:  # a WINDOW_UPDATE of a stream that has ended is ignored (RFC 9113 6.9)
                    self.handle_connection_frame(kind, flags, payload)
        except (GrpcFailure, BlockingIOError):
            return False
        return self.usable

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except TimeoutError:
            raise
        except OSError as exc:
            self.close()
            raise GrpcFailure(_UNAVAILABLE, f"the gateway closed the connection ({exc.strerror or exc})") from None

    def set_deadline(self, deadline: float | None) -> None:
        """Bound every following socket operation by `deadline` (time.monotonic())."""
        self._deadline = deadline
        self._arm()

    def _arm(self) -> None:
        """The socket timeout to what is left until the deadline (checked before every read, so
        a peer trickling bytes cannot stretch a call past it), or until the next keepalive step
        if that comes first."""
        keepalive = KEEPALIVE_TIMEOUT_SECONDS if self._pinged else KEEPALIVE_SECONDS
        if self._deadline is None:
            self._sock.settimeout(keepalive)
            return
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self._sock.settimeout(min(remaining, keepalive))

    def _keepalive(self) -> None:
        """Nothing heard for a keepalive interval: send a PING, or, when the last one is still
        unanswered, drop the connection and fail the call."""
        if self._pinged:
            self.close()
            raise GrpcFailure(
                _UNAVAILABLE,
                f"the gateway did not answer a keepalive ping within {KEEPALIVE_TIMEOUT_SECONDS:g} s"
                " (stopped, hung or unreachable)",
            )
        self._send(_frame(_PING, 0, 0, b"\0" * 8))
        self._pinged = True

    def protocol_error(self, what: str) -> GrpcFailure:
        """Drop the connection; the failure to raise for a peer that broke HTTP/2."""
        self.close()
        return GrpcFailure(_INTERNAL, f"HTTP/2 protocol error: {what}")

    def _read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            self._arm()
            try:
                chunk = self._sock.recv(max(65_536, count - len(self._buffer)))
            except TimeoutError:
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    raise
                self._keepalive()
                continue
            except OSError as exc:
                self.close()
                raise GrpcFailure(_UNAVAILABLE, f"the gateway closed the connection ({exc.strerror or exc})") from None
            if not chunk:
                self.close()
                raise GrpcFailure(_UNAVAILABLE, "the gateway closed the connection")
            self._pinged = False  # it is alive (its PING ACK, or anything else)
            self._buffer += chunk
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def read_frame(self) -> tuple[int, int, int, bytes]:
        """The next frame: (type, flags, stream id, payload)."""
        head = self._read(9)
        length = int.from_bytes(head[:3], "big")
        kind = head[3]
        if (kind in _EXACT_LENGTHS and length != _EXACT_LENGTHS[kind]) or (kind == _GOAWAY and length < 8):
            raise self.protocol_error(f"a frame of type {kind} with {length} octets")
        stream = _HEADER.unpack_from(head, 5)[0] & 0x7FFFFFFF
        return kind, head[4], stream, self._read(length) if length else b""

    def handle_connection_frame(self, kind: int, flags: int, payload: bytes) -> None:
        """SETTINGS, PING, WINDOW_UPDATE and GOAWAY on stream 0."""
        if kind == _SETTINGS and not flags & _ACK:
            if len(payload) % 6:
                raise self.protocol_error(f"SETTINGS of {len(payload)} octets, not a multiple of 6")
            for at in range(0, len(payload), 6):
                key, value = struct.unpack_from(">HI", payload, at)
                if key == _SETTINGS_MAX_FRAME:
                    if not _MIN_FRAME <= value <= _OUR_MAX_FRAME:
                        raise self.protocol_error(f"SETTINGS_MAX_FRAME_SIZE {value} is outside [2^14, 2^24-1]")
                    self._peer_max_frame = value
                elif key == _SETTINGS_INITIAL_WINDOW:
                    if value > _MAX_WINDOW:
                        raise self.protocol_error(f"SETTINGS_INITIAL_WINDOW_SIZE {value} is over 2^31-1")
                    self.window_delta += value - self._peer_initial_window
                    self._peer_initial_window = value
            self._send(_frame(_SETTINGS, _ACK, 0))
        elif kind == _PING and not flags & _ACK:
            self._send(_frame(_PING, _ACK, 0, payload))
        elif kind == _WINDOW_UPDATE:
            self._send_window += struct.unpack(">I", payload)[0] & 0x7FFFFFFF
        elif kind == _GOAWAY:
            self.usable = False
            self.goaway_last_stream = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF

    def decode_headers(self, flags: int, payload: bytes, stream: int) -> list[tuple[str, str]]:
        """A HEADERS frame's header list, reading its CONTINUATION frames."""
        payload = self.unpad(flags, payload)
        if flags & _PRIORITY_FLAG:
            if len(payload) < 5:
                raise self.protocol_error("HEADERS shorter than its priority fields")
            payload = payload[5:]
        block = bytearray(payload)
        while not flags & _END_HEADERS:
            if len(block) > MAX_HEADER_LIST_BYTES:
                raise self.protocol_error(f"a header block past {MAX_HEADER_LIST_BYTES} octets")
            kind, flags, on, more = self.read_frame()
            if kind != _CONTINUATION or on != stream:
                raise self.protocol_error("a header block was interrupted")
            block += more
        try:
            return self._decoder.decode(bytes(block))
        except HpackError as exc:
            raise self.protocol_error(str(exc)) from None

    def unpad(self, flags: int, payload: bytes) -> bytes:
        """A DATA or HEADERS payload without its padding (RFC 9113 6.1)."""
        if not flags & _PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise self.protocol_error("padding as long as the frame or longer")
        return payload[1 : len(payload) - payload[0]]

    def received(self, stream: int, count: int, stream_received: int) -> int:
        """Account for `count` DATA octets; top up the windows when much has been read. Returns
        the stream's new count of octets read since its last top-up."""
        self._received += count
        stream_received += count
        if self._received >= _REPLENISH_AFTER:
            self._send(_frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
            self._received = 0
        if stream_received >= _REPLENISH_AFTER:
            self._send(_frame(_WINDOW_UPDATE, 0, stream, struct.pack(">I", stream_received)))
            stream_received = 0
        return stream_received

    def start(self, path: str, message: bytes, metadata: Sequence[tuple[str, str]], *, deadline: float | None) -> Call:
        """Send one request (headers, then the message) and return the call to read it from."""
        stream = self._next_stream
        self._next_stream += 2
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self._authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if deadline is not None:
            headers.append(("grpc-timeout", grpc_timeout(deadline - time.monotonic())))
        headers.extend((key.lower(), value) for key, value in metadata)
        block = encode_headers(headers)
        frames = bytearray()
        first = True
        while first or block:
            piece, block = block[: self._peer_max_frame], block[self._peer_max_frame :]
            flags = _END_HEADERS if not block else 0
            frames += _frame(_HEADERS if first else _CONTINUATION, flags, stream, piece)
            first = False
        self._send(bytes(frames))
        self.window_delta = 0
        call = Call(self, stream, deadline=deadline)
        call.send_message(message)
        return call

    def send_data(self, stream: int, data: bytes, *, end: bool, stream_window: int) -> int:
        """Send as much of `data` as the windows allow (all of it when they do); the octets sent."""
        sent = 0
        while True:
            room = min(self._send_window, stream_window - sent, self._peer_max_frame, len(data) - sent)
            if room <= 0 and sent < len(data):
                return sent
            last = sent + room == len(data)
            self._send(_frame(_DATA, _END_STREAM if last and end else 0, stream, data[sent : sent + room]))
            self._send_window -= room
            sent += room
            if last:
                return sent

    def cancel(self, stream: int) -> None:
        """RST_STREAM(CANCEL), then drop the connection (frames of the stream may still come)."""
        try:
            if self.usable:
                self._sock.sendall(_frame(_RST_STREAM, 0, stream, struct.pack(">I", 0x8)))
        except OSError:
            pass
        self.close()


class Call:
    """One gRPC call on a `Connection`: iterate it for the response messages (bytes); it raises
    `GrpcFailure` when the call ends with a non-OK status, or `TimeoutError` at its deadline."""

    def __init__(self, connection: Connection, stream: int, *, deadline: float | None) -> None:
        self._conn = connection
        self._stream = stream
        self._deadline = deadline
        self._send_window = connection._peer_initial_window
        self._received = 0
        self._pending = bytearray()  # our request octets not yet sent (flow control)
        self._data = bytearray()  # response octets not yet a whole message
        self._messages: list[bytes] = []
        self._response_headers: dict[str, str] | None = None
        self._status: int | None = None
        self._message = ""
        self.finished = False

    def send_message(self, message: bytes) -> None:
        """The request's one message, as far as the windows let it go now (the rest as they open)."""
        self._pending = bytearray(b"\x00" + struct.pack(">I", len(message)) + message)
        self._flush()

    def _flush(self) -> None:
        if not self._pending or self.finished:
            return
        sent = self._conn.send_data(self._stream, bytes(self._pending), end=True, stream_window=self._send_window)
        self._send_window -= sent
        del self._pending[:sent]

    def cancel(self) -> None:
        """Stop the call (the server sees CANCELLED); the connection is not reused."""
        if not self.finished:
            self.finished = True
            self._conn.cancel(self._stream)

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                while self._messages:
                    yield self._messages.pop(0)
                if self.finished:
                    break
                self._step()
        except TimeoutError:
            self.cancel()
            raise
        if self._status is None:
            self._conn.close()
            raise GrpcFailure(_UNKNOWN, "the stream ended without a gRPC status")
        if self._status != 0:
            raise GrpcFailure(self._status, self._message)

    def _step(self) -> None:
        """Read and act on one frame."""
        conn = self._conn
        conn.set_deadline(self._deadline)
        kind, flags, stream, payload = conn.read_frame()
        if stream == 0:
            conn.handle_connection_frame(kind, flags, payload)
            if conn.goaway_last_stream is not None and conn.goaway_last_stream < self._stream:
                self._fail(_UNAVAILABLE, "the gateway is shutting down (GOAWAY)")
            self._send_window += conn.window_delta
            conn.window_delta = 0
            self._flush()
            return
        if stream != self._stream:
            return  # a late frame of an earlier, cancelled stream
        if kind == _WINDOW_UPDATE:
            self._send_window += struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            self._flush()
        elif kind == _HEADERS:
            self._headers(conn.decode_headers(flags, payload, stream), end=bool(flags & _END_STREAM))
        elif kind == _DATA:
            self._received = conn.received(stream, len(payload), self._received)
            self._data += conn.unpad(flags, payload)
            self._split_messages()
            if flags & _END_STREAM:
                self._end()
        elif kind == _RST_STREAM:
            code = struct.unpack(">I", payload)[0]
            if self._status is None:
                self._fail(_RST_CODES.get(code, _INTERNAL), f"the stream was reset (HTTP/2 error {code})")
        elif kind == _PUSH_PROMISE:
            raise conn.protocol_error("a push we did not allow")

    def _fail(self, status: int, message: str) -> None:
        self._status, self._message = status, message
        self.finished = True
        self._conn.close()

    def _headers(self, headers: list[tuple[str, str]], *, end: bool) -> None:
        fields = dict(headers)
        if self._response_headers is None:
            self._response_headers = fields
            http_status = fields.get(":status", "")
            if http_status != "200":
                code = int(http_status) if http_status.isdigit() else 0
                status = _HTTP_STATUS_CODES.get(code, _UNAVAILABLE if code in (429, 502, 503, 504) else _UNKNOWN)
                self._fail(status, f"the gateway answered HTTP {http_status or '(none)'}")
                return
            if not fields.get("content-type", "").startswith("application/grpc"):
                self._fail(_UNKNOWN, f"not a gRPC answer (content-type {fields.get('content-type')!r})")
                return
        if "grpc-status" in fields:
            text = fields["grpc-status"]
            self._status = int(text) if text.isdigit() else _UNKNOWN
            self._message = unquote(fields.get("grpc-message", ""))
        if end:
            self._end()

    def _split_messages(self) -> None:
        data = self._data
        while len(data) >= 5:
            if data[0]:
                self._fail(_INTERNAL, "a compressed message, which this client did not ask for")
                return
            length = _HEADER.unpack_from(data, 1)[0]
            if length > MAX_RECEIVE_MESSAGE_BYTES:
                self.cancel()
                self._status, self._message = (
                    _RESOURCE_EXHAUSTED,
                    f"received message larger than max ({length} vs. {MAX_RECEIVE_MESSAGE_BYTES})",
                )
                return
            if len(data) < 5 + length:
                return
            self._messages.append(bytes(data[5 : 5 + length]))
            del data[: 5 + length]

    def _end(self) -> None:
        self.finished = True
        if self._pending:
            self._conn.usable = False  # the server answered before it read all of our request
        if self._data and self._status == 0:
            self._status, self._message = _INTERNAL, "the stream ended inside a message"
