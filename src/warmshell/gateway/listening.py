"""Where the gateway listens. The public API (SandboxService) is served on the public socket and
TCP only; `supervisor.sock` serves the supervisor API alone, so a leaked API token is of no use
to a caller that can reach only that socket. Each server accepts a bounded number of connections
and streams per connection, so a flood of connections is refused at accept instead of pinning
the gateway at its file-descriptor limit; a connection that never completes its handshake, or
carries no call for long, gives its slot back, so idle connections cannot hold the server shut."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

__all__ = [
    "HTTP_MAX_CONNECTIONS",
    "MAX_STREAMS_PER_CONNECTION",
    "SHUTDOWN_GRACE_SECONDS",
    "STOPPING",
    "Servers",
    "StopGate",
    "connection_limit",
    "listener_budget",
    "new_server",
]

# A supervisor uses a handful of streams, a CLI one per command; more from one connection is a flood.
MAX_STREAMS_PER_CONNECTION = 128
# Descriptors the listeners never take, whatever they are configured to accept: at least half of
# the process's, and never fewer than this. They are the core's: the store, every sandbox's
# supervisor pipes, pidfds and agent socket, the driver's files.
FD_HEADROOM = 1024
MIN_CONNECTIONS = 16
SERVERS = 2  # the gRPC servers (public + TCP, supervisor socket)
# On a stop, calls in flight get this long to finish before they are cancelled.
SHUTDOWN_GRACE_SECONDS = 5.0
# Clients may PING this often during a call (half the SDK's keepalive interval, for jitter).
MIN_CLIENT_PING_INTERVAL_MS = 5_000
# The HTTP port serves probes and a scraper (`http.py`).
HTTP_MAX_CONNECTIONS = 64


def listener_budget(fd_limit: int) -> int:
    """Descriptors all the listeners together (the gRPC servers and HTTP) may hold."""
    return max(0, fd_limit - max(FD_HEADROOM, fd_limit // 2))


def connection_limit(configured: int, fd_limit: int) -> int:
    """Connections allowed per gRPC server: as configured, but within the listeners' budget once
    HTTP has its share (`MIN_CONNECTIONS` at least, so a tiny limit still serves)."""
    share = (listener_budget(fd_limit) - HTTP_MAX_CONNECTIONS) // SERVERS
    return max(MIN_CONNECTIONS, min(configured, share))


def new_server(
    *,
    max_connections: int,
    max_receive_bytes: int,
    handshake_timeout_seconds: float = 10.0,
    connection_idle_seconds: float = 0,
    max_connection_age_seconds: float = 0,
    interceptors: Sequence[Interceptor] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with the gateway's limits. A connection is closed if its handshake (the
    client's preface and SETTINGS) takes longer than `handshake_timeout_seconds`, and told to go
    away once it has carried no call for `connection_idle_seconds` (0 = never).
    `max_connection_age_seconds` (replicas): a connection that old is told to go away gracefully
    (GOAWAY; its streams carry on), so clients behind a Service reconnect, and spread over the
    replicas, without losing a call."""
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if fd_limit == resource.RLIM_INFINITY:
        fd_limit = 1 << 20
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", connection_limit(max_connections, fd_limit)),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.server_handshake_timeout_ms", max(1, int(handshake_timeout_seconds * 1000))),
        # The SDK pings every 10 s of silence during a call, to learn that a gateway stopped;
        # grpc's default policy would answer a second PING within 5 minutes with GOAWAY.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 0),
    ]
    if connection_idle_seconds > 0:
        options.append(("grpc.max_connection_idle_ms", int(connection_idle_seconds * 1000)))
    if max_connection_age_seconds > 0:
        options.append(("grpc.max_connection_age_ms", int(max_connection_age_seconds * 1000)))
    return grpc.aio.server(options=options, interceptors=interceptors)


STOPPING = "gateway stopping: retry on another replica, or once it is back"


Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Interceptor: TypeAlias = "grpc.aio.ServerInterceptor[Any, Any]"  # generic in grpc's stubs only

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class StopGate(_Interceptor):
    """Once closed, every new call is answered UNAVAILABLE "gateway stopping" by the gateway
    itself (a client retries it, as it would after a crash), while the calls in flight go on.
    A server's own stop refuses new streams too, but with transport errors that say nothing."""

    def __init__(self) -> None:
        self.closed = False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        """The method's own handler while open, one that refuses the call once closed (an
        unknown method's None is passed on: UNIMPLEMENTED)."""
        handler = await continuation(details)
        return _refusing(handler) if self.closed and handler is not None else handler


async def _refuse(_: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)


def _refusing(handler: Handler) -> Handler:
    """A handler of the same shape as `handler` that refuses its call."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        _refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class Servers:
    """The gateway's gRPC servers, started together and stopped together: `refuse_new_calls`
    answers new calls "gateway stopping" while those in flight go on; `begin_stop` closes the
    connections (GOAWAY: clients retry elsewhere) while the calls in flight get
    `SHUTDOWN_GRACE_SECONDS`; `wait_stopped` waits for the end of that."""

    def __init__(self, servers: Sequence[grpc.aio.Server], gate: StopGate) -> None:
        """`gate`: the interceptor every one of `servers` was made with."""
        self._servers = tuple(servers)
        self._gate = gate
        self._stopping: list[asyncio.Future[None]] = []

    def refuse_new_calls(self) -> None:
        """Answer every new call UNAVAILABLE "gateway stopping" from now on."""
        self._gate.closed = True

    async def start(self) -> None:
        """Start serving on the ports added so far."""
        for server in self._servers:
            await server.start()

    def begin_stop(self) -> None:
        """Refuse new calls from now on (idempotent); returns without waiting."""
        if not self._stopping:
            self._stopping = [asyncio.ensure_future(s.stop(SHUTDOWN_GRACE_SECONDS)) for s in self._servers]

    async def wait_stopped(self) -> None:
        """Stop (if not begun yet) and wait until the last call has ended or been cancelled."""
        self.begin_stop()
        await asyncio.gather(*self._stopping)
