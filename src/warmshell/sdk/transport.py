"""How the SDK moves protobuf messages to the gateway: a `Transport` makes unary and
server-streaming calls by method path and raises SDK exceptions (never a transport's own).

Two implementations behind one protocol:
- `GrpcTransport`: a grpcio channel (any target, TCP or Unix; what long-lived programs use);
- `Http2Transport`: `warmshell.sdk.http2` on a Unix socket, which imports in a millisecond where
  grpcio takes 60-90 ms; the CLI uses it, since every CLI call is a new process.

`open_transport` picks one: the caller's preference, overridden by $WARMSHELL_TRANSPORT
(`grpcio` or `http2`); `http2` applies to Unix-socket targets only, others use grpcio. Calls a
transport does not carry (client streaming: file writes) go over `grpc_channel()`, opened on
first use.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from google.protobuf.message import DecodeError

from warmshell.sdk import connection, errors, http2
from warmshell.sdk.http2_pool import IdlePool

if TYPE_CHECKING:
    import grpc
    from google.protobuf.message import Message

__all__ = [
    "CHANNEL_OPTIONS",
    "ENV_TRANSPORT",
    "TRANSPORTS",
    "GrpcTransport",
    "Http2Transport",
    "Metadata",
    "ServerStream",
    "Transport",
    "chosen_transport",
    "open_transport",
]

ENV_TRANSPORT = "WARMSHELL_TRANSPORT"
TRANSPORTS = ("grpcio", "http2")
# The gateway sends up to 16 MiB in one message (a long ListSandboxes); grpc's default is 4 MiB.
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    # Keepalive as the HTTP/2 client does it (see http2.KEEPALIVE_SECONDS): a PING after that
    # much silence during a call, the connection failed when it goes unanswered; as many PINGs
    # as a silent call needs (grpc's default stops after 2 without data). grpc 1.85 fails an
    # unanswered PING after ping_timeout_ms (1 minute by default), not after keepalive_timeout_ms.
    ("grpc.keepalive_time_ms", int(http2.KEEPALIVE_SECONDS * 1000)),
    ("grpc.keepalive_timeout_ms", int(http2.KEEPALIVE_TIMEOUT_SECONDS * 1000)),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", int(http2.KEEPALIVE_TIMEOUT_SECONDS * 1000)),
)

M = TypeVar("M", bound="Message")
M_co = TypeVar("M_co", bound="Message", covariant=True)
Metadata = Sequence[tuple[str, str]]


class ServerStream(Iterator[M_co], Protocol):
    """The responses of a server-streaming call; `cancel()` stops it (a no-op once ended)."""

    def cancel(self) -> None:
        """Stop the call; the server sees it cancelled."""


class Transport(Protocol):
    """Unary and server-streaming calls to one gateway; failures raise `errors.ApiError`s."""

    address: str

    def unary(
        self, method: str, request: Message, response_type: type[M], *, metadata: Metadata, timeout: float | None
    ) -> M:
        """Call `method` (e.g. "/warmshell.v1.SandboxService/GetSandbox") and return its answer."""
        ...

    def server_stream(
        self, method: str, request: Message, response_type: type[M], *, metadata: Metadata, timeout: float | None
    ) -> ServerStream[M]:
        """Start a server-streaming call; iterate the result for the responses."""
        ...

    def grpc_channel(self) -> grpc.Channel:
        """A grpcio channel to the same gateway, for calls this transport does not carry."""
        ...

    def close(self) -> None:
        """Release the connections (idempotent); calls in flight fail."""
        ...


class GrpcStream(Iterator[M]):
    """A grpcio response stream whose failures are SDK exceptions (a `ServerStream`)."""

    def __init__(self, call: grpc.CallIterator[M], address: str) -> None:
        self._call = call
        self._responses = iter(call)
        self._address = address

    def __next__(self) -> M:
        with errors.translating(self._address):
            return next(self._responses)

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it untyped


class GrpcTransport:
    """grpcio's blocking channel (thread-safe: calls are multiplexed on its connection)."""

    def __init__(self, address: str) -> None:
        import grpc

        from warmshell.sdk import queueing

        self.address = address
        # A connection of its own, with at most `queueing.MAX_CONCURRENT_STREAMS` calls in
        # flight: threads past that wait for a stream instead of having it refused.
        options = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
        self._raw_channel = grpc.insecure_channel(address, options=options)
        self._channel = grpc.intercept_channel(self._raw_channel, queueing.ThreadSlots())
        # One multicallable per method, as generated stubs keep them (making one per call costs).
        self._calls: dict[tuple[bool, str], Any] = {}

    def _callable(self, method: str, request: Message, response_type: type[Message], *, streaming: bool) -> Any:
        call = self._calls.get((streaming, method))
        if call is None:
            make = self._channel.unary_stream if streaming else self._channel.unary_unary
            serialize, deserialize = type(request).SerializeToString, response_type.FromString
            call = self._calls.setdefault(
                (streaming, method), make(method, request_serializer=serialize, response_deserializer=deserialize)
            )
        return call

    def unary(
        self, method: str, request: Message, response_type: type[M], *, metadata: Metadata, timeout: float | None
    ) -> M:
        call = self._callable(method, request, response_type, streaming=False)
        with errors.translating(self.address):
            response: M = call(request, metadata=tuple(metadata), timeout=timeout)
        return response

    def server_stream(
        self, method: str, request: Message, response_type: type[M], *, metadata: Metadata, timeout: float | None
    ) -> ServerStream[M]:
        call = self._callable(method, request, response_type, streaming=True)
        with errors.translating(self.address):
            return GrpcStream(call(request, metadata=tuple(metadata), timeout=timeout), self.address)

    def grpc_channel(self) -> grpc.Channel:
        return self._channel

    def close(self) -> None:
        self._raw_channel.close()


class _Http2Stream(Iterator[M]):
    """Messages of one `http2.Call`, decoded; hands its connection back to the pool at the end."""

    def __init__(
        self, transport: Http2Transport, conn: http2.Connection, call: http2.Call, response_type: type[M]
    ) -> None:
        self._transport = transport
        self._conn = conn
        self._call = call
        self._messages = iter(call)
        self._type = response_type

    def __next__(self) -> M:
        try:
            raw = next(self._messages)
        except StopIteration:
            self._transport._release(self._conn)
            raise
        except http2.GrpcFailure as exc:
            self._transport._release(self._conn)  # reused only if the call ended cleanly
            raise self._transport._error(exc) from None
        except TimeoutError:
            self._conn.close()
            raise errors.error_for("DEADLINE_EXCEEDED", "Deadline Exceeded", address=self._transport.address) from None
        except BaseException:  # Ctrl-C in the middle of a frame: the connection is unusable
            self._call.cancel()
            raise
        try:
            return self._type.FromString(raw)
        except DecodeError:
            self._call.cancel()
            detail = f"the gateway's answer is not a valid {self._type.DESCRIPTOR.full_name}"
            raise errors.error_for("INTERNAL", detail, address=self._transport.address) from None

    def cancel(self) -> None:
        self._call.cancel()


class Http2Transport:
    """`warmshell.sdk.http2` on a Unix socket. Thread-safe: each call takes an idle connection
    from the pool (`http2_pool`; or dials one: a Unix connect costs microseconds) and gives it
    back when it ends cleanly."""

    def __init__(self, address: str, path: Path) -> None:
        self.address = address
        self._path = path
        self._idle = IdlePool()
        self._lock = threading.Lock()
        self._grpc: GrpcTransport | None = None

    def _error(self, failure: http2.GrpcFailure) -> errors.ApiError:
        return errors.error_for(failure.code, failure.message, address=self.address)

    def _dial(self, deadline: float | None) -> http2.Connection:
        conn = self._idle.take()
        if conn is not None:
            return conn
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        try:
            return http2.Connection(http2.connect_unix(str(self._path), timeout))
        except FileNotFoundError:
            raise errors.no_gateway_socket(self._path) from None
        except TimeoutError:
            raise errors.error_for("DEADLINE_EXCEEDED", "Deadline Exceeded", address=self.address) from None
        except http2.GrpcFailure as exc:
            raise self._error(exc) from None
        except OSError as exc:
            detail = f"failed to connect to {self.address}: {exc.strerror or exc}"
            raise errors.error_for("UNAVAILABLE", detail, address=self.address) from None

    def _release(self, conn: http2.Connection) -> None:
        self._idle.put(conn)

    def _start(
        self, method: str, request: Message, response_type: type[M], metadata: Metadata, timeout: float | None
    ) -> _Http2Stream[M]:
        deadline = None if timeout is None else time.monotonic() + timeout
        conn = self._dial(deadline)
        try:
            conn.set_deadline(deadline)
            call = conn.start(method, request.SerializeToString(), metadata, deadline=deadline)
        except http2.GrpcFailure as exc:
            conn.close()
            raise self._error(exc) from None
        except TimeoutError:
            conn.close()
            raise errors.error_for("DEADLINE_EXCEEDED", "Deadline Exceeded", address=self.address) from None
        except BaseException:
            conn.close()
            raise
        return _Http2Stream(self, conn, call, response_type)

    def unary(
        self, method: str, request: Message, response_type: type[M], *, metadata: Metadata, timeout: float | None
    ) -> M:
        responses = self._start(method, request, response_type, metadata, timeout)
        answer: M | None = None
        for response in responses:
            if answer is not None:  # stop at the second: a peer could send them for ever
                responses.cancel()
                raise errors.error_for("UNIMPLEMENTED", f"{method} answered more than one message")
            answer = response
        if answer is None:
            raise errors.error_for("UNIMPLEMENTED", f"{method} answered no message")
        return answer

    def server_stream(
        self, method: str, request: Message, response_type: type[M], *, metadata: Metadata, timeout: float | None
    ) -> ServerStream[M]:
        return self._start(method, request, response_type, metadata, timeout)

    def grpc_channel(self) -> grpc.Channel:
        with self._lock:
            if self._grpc is None:
                self._grpc = GrpcTransport(self.address)
            return self._grpc.grpc_channel()

    def close(self) -> None:
        self._idle.close()
        with self._lock:
            fallback, self._grpc = self._grpc, None
        if fallback is not None:
            fallback.close()


def chosen_transport(preferred: str, environ: Mapping[str, str] | None = None) -> str:
    """The transport name to use: $WARMSHELL_TRANSPORT when set, else `preferred`."""
    env = os.environ if environ is None else environ
    name = env.get(ENV_TRANSPORT) or preferred
    if name not in TRANSPORTS:
        raise errors.InvalidArgument(
            f"{ENV_TRANSPORT}: {name!r} is not one of {', '.join(TRANSPORTS)}", code="INVALID_ARGUMENT"
        )
    return name


def open_transport(address: str, preferred: str = "grpcio") -> Transport:
    """A transport to `address`: HTTP/2 for a Unix socket when chosen (see the module), else grpcio."""
    socket_path = connection.unix_socket_path(address)
    if chosen_transport(preferred) == "http2" and socket_path is not None:
        return Http2Transport(address, socket_path)
    return GrpcTransport(address)
