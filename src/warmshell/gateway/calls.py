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
from typing import Any, NoReturn, TypeVar

import grpc

from warmshell.core.errors import WarmshellError
from warmshell.gateway.auth import Unauthenticated
from warmshell.gateway.context import CallContext
from warmshell.gateway.errors import status_code_for

__all__ = ["INTERNAL_MESSAGE", "abort_for", "drain_before_refusal", "refuse_stream", "streaming", "unary"]

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = TypeVar("Ctx", bound=CallContext)


INTERNAL_MESSAGE = "internal error in the gateway (its log has the details)"

# What the caller of a refused request stream may still send before its refusal goes out, read
# and dropped (`drain_before_refusal`): a supervisor's hello and what its outbox held (up to
# 1 MiB of output, `supervisor.outbox.DEFAULT_MAX_BYTES`, and its exits), an exec's first stdin,
# an import's first chunks. A caller that keeps its stream open without writing (a supervisor
# waiting for its session, an interactive stdin) waits no longer than this.
REFUSAL_DRAIN_SECONDS = 0.5
REFUSAL_DRAIN_BYTES = 2 * 1024 * 1024


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


async def refuse_stream(context: CallContext, requests: object, exc: Exception, where: str) -> NoReturn:
    """`abort_for`, after the caller's messages still coming are read (`drain_before_refusal`)
    when `requests` is the request stream of a call over a socket. In process (a local
    sandbox's supervisor) there is no grpc client to misreport the status, and what a drain
    took from the supervisor's outbox would be lost to its next session."""
    over_a_socket = callable(getattr(context, "peer", None))
    if over_a_socket and isinstance(requests, AsyncIterator):
        await drain_before_refusal(requests, seconds=REFUSAL_DRAIN_SECONDS, max_bytes=REFUSAL_DRAIN_BYTES)
    await abort_for(context, exc, where)


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
    a status (see the module doc), sent once a request stream's caller has stopped writing
    (`refuse_stream`)."""

    @wraps(handler)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise  # the handler set the status itself
        except Exception as exc:
            await refuse_stream(context, request, exc, handler.__qualname__)

    return wrapper


def streaming(
    handler: Callable[[Any, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[Any, Req, Ctx], AsyncIterator[Resp]]:
    """Wrap a response-streaming handler so every exception becomes a status (see the module
    doc), sent once a request stream's caller has stopped writing (`refuse_stream`)."""

    @wraps(handler)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            async for item in handler(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await refuse_stream(context, request, exc, handler.__qualname__)

    return wrapper
