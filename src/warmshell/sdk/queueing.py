"""Queueing a client's calls against the gateway's limit of concurrent streams on one
connection, so a wide fan-out on one client (tasks of an `AsyncClient`, threads sharing a
`Client`) waits for a stream instead of failing.

Every gRPC call is an HTTP/2 stream, and the gateway accepts 128 at once per connection (its
SETTINGS_MAX_CONCURRENT_STREAMS; `gateway/listening.py`). grpcio's client does not hold calls
back to that limit: 500 file writes started at once on one AsyncClient had 157 refused
(RST_STREAM REFUSED_STREAM, `Unavailable`). grpc.aio does not show the peer's SETTINGS, so the
client admits calls through interceptors that let `MAX_CONCURRENT_STREAMS` be open at a time
and queue the rest in arrival order.

A stream holds its slot until it ends: a client with that many long-lived streams open (execs,
watches, interactive processes) makes further calls wait for one of them to end; for more
concurrent streams than that, use another client (each has a connection of its own).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
from grpc import aio

__all__ = ["MAX_CONCURRENT_STREAMS", "CallOpener", "StreamSlots", "ThreadSlots", "open_now"]

# Half the gateway's streams per connection (`gateway.listening.MAX_STREAMS_PER_CONNECTION`, 128;
# the SDK may not import the gateway). Not all of it: the gateway counts a stream until its
# handler's call is released, after the client has seen the answer, so a client holding 128 in
# flight still had streams refused (500 unary calls at once: ~60 refused; 100 in flight: ~20);
# at 64, 2000 calls at once (unary, and file writes) on a host at load 10 had none refused.
MAX_CONCURRENT_STREAMS = 64

# grpc-stubs make the interceptor bases generic; grpc's own classes are not subscriptable.
if TYPE_CHECKING:
    _UnaryUnary = aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = aio.UnaryStreamClientInterceptor[Any, Any]
    _SyncUnaryUnary = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _SyncUnaryStream = grpc.UnaryStreamClientInterceptor[Any, Any]
    _SyncStreamUnary = grpc.StreamUnaryClientInterceptor[Any, Any]
    _SyncStreamStream = grpc.StreamStreamClientInterceptor[Any, Any]
else:
    _UnaryUnary = aio.UnaryUnaryClientInterceptor
    _UnaryStream = aio.UnaryStreamClientInterceptor
    _SyncUnaryUnary = grpc.UnaryUnaryClientInterceptor
    _SyncUnaryStream = grpc.UnaryStreamClientInterceptor
    _SyncStreamUnary = grpc.StreamUnaryClientInterceptor
    _SyncStreamStream = grpc.StreamStreamClientInterceptor

C = TypeVar("C", bound=aio.Call)


class CallOpener(Protocol):
    """Starts a call that writes its requests as it goes (`StreamSlots.open`)."""

    async def __call__(self, start: Callable[[], C]) -> C:
        """`start()` once the call may go."""
        ...


async def open_now(start: Callable[[], C]) -> C:
    """A `CallOpener` without a limit."""
    return start()


class StreamSlots:
    """`limit` slots shared by every call on a channel: each call waits for one, held until the
    call ends (answered, failed or cancelled). Calls without a request stream are admitted by
    `interceptors()`; those that write requests as they go (file writes, interactive execs)
    are started through `open`, since grpc.aio's interceptors put every such write through a
    task and a queue of their own (and leave that queue's reader behind when the call ends
    before the client is done writing, as an interactive exec does)."""

    def __init__(self, limit: int = MAX_CONCURRENT_STREAMS) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self.in_use = 0  # calls holding a slot

    def interceptors(self) -> list[Any]:  # grpc-stubs leave aio.ClientInterceptor a placeholder
        """The channel's interceptors (a channel files each under one kind of call only)."""
        return [_UnaryUnaryAdmission(self), _UnaryStreamAdmission(self)]

    async def open(self, start: Callable[[], C]) -> C:
        """`start()` a call once a slot is free; the slot is given back when the call ends."""
        await self._take()
        return self._held(start)

    async def admit(self, continuation: Callable[[Any, Any], Awaitable[Any]], details: Any, request: Any) -> Any:
        """An interceptor's step: the call, started once a slot is free."""
        await self._take()
        try:
            call = await continuation(details, request)
        except BaseException:
            self._release(None)
            raise
        call.add_done_callback(self._release)
        return call

    async def _take(self) -> None:
        await self._slots.acquire()
        self.in_use += 1

    def _held(self, start: Callable[[], C]) -> C:
        try:
            call = start()
        except BaseException:
            self._release(None)
            raise
        call.add_done_callback(self._release)
        return call

    def _release(self, _: object) -> None:
        self.in_use -= 1
        self._slots.release()


class _UnaryUnaryAdmission(_UnaryUnary):
    def __init__(self, slots: StreamSlots) -> None:
        self._slots = slots

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._slots.admit(continuation, client_call_details, request)


class _UnaryStreamAdmission(_UnaryStream):
    def __init__(self, slots: StreamSlots) -> None:
        self._slots = slots

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._slots.admit(continuation, client_call_details, request)


class ThreadSlots(_SyncUnaryUnary, _SyncUnaryStream, _SyncStreamUnary, _SyncStreamStream):
    """`StreamSlots` for the sync client's grpcio channel (`grpc.intercept_channel`), whose
    threads fan out the same way: a call blocks its thread until a slot is free."""

    def __init__(self, limit: int = MAX_CONCURRENT_STREAMS) -> None:
        self._slots = threading.BoundedSemaphore(limit)

    def _admit(self, continuation: Callable[[Any, Any], Any], details: Any, request: Any) -> Any:
        self._slots.acquire()
        try:
            call = continuation(details, request)
        except BaseException:
            self._slots.release()
            raise
        call.add_done_callback(lambda _: self._slots.release())
        return call

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return self._admit(continuation, client_call_details, request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return self._admit(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return self._admit(continuation, client_call_details, request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return self._admit(continuation, client_call_details, request_iterator)
