"""Turning exceptions into gRPC statuses at the edge of every handler.

Domain errors carry their own status and message. Anything else is a gateway bug: the client gets
INTERNAL with a plain sentence (never an exception's class or text, which may quote a request's
values), and the traceback goes to the gateway's log. Cancellation (the client went away, or the
transport failed the call, e.g. a message over `max_request_bytes`: gRPC has then set the status
itself) is not an error of ours and passes through untouched."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import Any, Generic, NoReturn, TypeVar

import grpc

from warmshell.core.errors import WarmshellError
from warmshell.gateway.auth import Unauthenticated
from warmshell.gateway.context import CallContext
from warmshell.gateway.errors import status_code_for

__all__ = [
    "INTERNAL_MESSAGE",
    "HeldStream",
    "abort_for",
    "drain_before_refusal",
    "drain_before_status",
    "held",
    "refuse_stream",
    "streaming",
    "unary",
]

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = TypeVar("Ctx", bound=CallContext)
T = TypeVar("T")


INTERNAL_MESSAGE = "internal error in the gateway (its log has the details)"

# What the caller of a refused request stream may still send before its refusal goes out, read
# and dropped (`drain_before_refusal`): a supervisor's hello and what its outbox held (up to
# 1 MiB of output, `supervisor.outbox.DEFAULT_MAX_BYTES`, and its exits), an exec's first stdin,
# an import's first chunks. A caller that keeps its stream open without writing (a supervisor
# waiting for its session, an interactive stdin) waits no longer than this.
REFUSAL_DRAIN_SECONDS = 0.5
REFUSAL_DRAIN_BYTES = 2 * 1024 * 1024


_END = object()


class HeldStream(Generic[T]):
    """A call's request stream that a task can stop reading mid-wait and another read on.

    grpcio hands a handler its request stream as an async generator: a task cancelled while it
    waits there for the next message closes it. The tasks that read a stream beside the handler
    (a session's reader, an exec's stdin relay) are cancelled exactly when the call fails, so
    the drain before its status then read nothing and the caller's writes raced the status
    (grpc/grpc#36066: INTERNAL). Here each wait for a message is a future of its own, left
    pending by a cancelled reader for the next one, the drain's; ~8 µs more per message."""

    def __init__(self, requests: AsyncIterator[T]) -> None:
        self._requests = aiter(requests)
        self._next: asyncio.Future[Any] | None = None

    def __aiter__(self) -> HeldStream[T]:
        return self

    async def __anext__(self) -> T:
        pending = self._next
        if pending is None:
            pending = self._next = asyncio.ensure_future(anext(self._requests, _END))
            # A read left pending when the call ends fails with it: nobody is owed that error.
            pending.add_done_callback(_retrieved)
        try:
            message = await asyncio.shield(pending)
        finally:
            if pending.done():
                self._next = None
        if message is _END:
            raise StopAsyncIteration
        return message  # type: ignore[no-any-return]


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def held(context: CallContext, requests: Req) -> Req:
    """`requests` as a `HeldStream` when it is the request stream of a call over a socket (in
    process nothing is drained: see `refuse_stream`), else as it is."""
    if _over_a_socket(context) and isinstance(requests, AsyncIterator):
        return HeldStream(requests)  # type: ignore[return-value]
    return requests


async def drain_before_refusal(requests: AsyncIterator[Any], *, seconds: float, max_bytes: int) -> None:
    """Read and drop what the caller of a refused request stream is still sending, for up to
    `seconds` and `max_bytes`, before the refusal goes out.

    grpcio's asyncio client (grpc/grpc#36066) replaces the server's status with INTERNAL
    ("Internal error from Core") when one of its writes starts after the server ended the call:
    one 8 MiB file write in four, and now and then a supervisor's hello, which it sends as soon
    as its call opens (it then retried a refusal as "gateway unreachable"). Reading the caller's
    messages and its half-close first puts its writes before the status; past the bounds the
    refusal goes out anyway."""
    dropped = 0
    with contextlib.suppress(Exception):  # the time bound, or a stream that broke: refuse anyway
        async with asyncio.timeout(seconds):
            async for message in requests:
                dropped += message.ByteSize()
                if dropped > max_bytes:
                    return


async def drain_before_status(context: CallContext, requests: object) -> None:
    """The caller's messages still coming read and dropped (`drain_before_refusal`) when
    `requests` is the request stream of a call over a socket. In process (a local sandbox's
    supervisor) there is no grpc client to misreport the status, and what a drain took from the
    supervisor's outbox would be lost to its next session."""
    if _over_a_socket(context) and isinstance(requests, AsyncIterator):
        await drain_before_refusal(requests, seconds=REFUSAL_DRAIN_SECONDS, max_bytes=REFUSAL_DRAIN_BYTES)


async def refuse_stream(context: CallContext, requests: object, exc: Exception, where: str) -> NoReturn:
    """`abort_for`, once the caller has stopped writing (`drain_before_status`)."""
    await drain_before_status(context, requests)
    await abort_for(context, exc, where)


def _over_a_socket(context: CallContext) -> bool:
    """A gRPC call's context (the in-process link's has no peer)."""
    return callable(getattr(context, "peer", None))


async def abort_for(context: CallContext, exc: Exception, where: str = "a call") -> NoReturn:
    """Abort the call with the status that matches `exc` (`where`: the handler, for the log)."""
    if isinstance(exc, Unauthenticated):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
    if isinstance(exc, WarmshellError):
        await context.abort(status_code_for(exc), str(exc))
    # Frames and source lines only: an exception's text may quote a request's or a credential's
    # value, and its class name with the frames is enough to find the bug.
    log.error(
        "internal error in %s: %s\n%s",
        where,
        type(exc).__qualname__,
        "".join(traceback.format_tb(exc.__traceback__)).rstrip(),
    )
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


def unary(
    handler: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    """Wrap a handler with one response (or none: it writes its own) so every exception becomes
    a status (see the module doc); a request stream's status, OK too, is sent once its caller
    has stopped writing (`drain_before_status`): an exec whose command exits while its client
    still sends stdin ends OK, not INTERNAL."""

    @wraps(handler)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        request = held(context, request)
        try:
            response = await handler(self, request, context)
        except grpc.aio.AbortError:
            raise  # the handler set the status itself
        except Exception as exc:
            await refuse_stream(context, request, exc, handler.__qualname__)
        await drain_before_status(context, request)
        return response

    return wrapper


def streaming(
    handler: Callable[[Any, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[Any, Req, Ctx], AsyncIterator[Resp]]:
    """Wrap a response-streaming handler so every exception becomes a status (see the module
    doc), sent once a request stream's caller has stopped writing (`drain_before_status`)."""

    @wraps(handler)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        request = held(context, request)
        try:
            async for item in handler(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await refuse_stream(context, request, exc, handler.__qualname__)
        await drain_before_status(context, request)

    return wrapper
