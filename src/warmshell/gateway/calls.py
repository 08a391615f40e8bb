"""Turning exceptions into gRPC statuses at the edge of every handler."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import Any, NoReturn, TypeVar

import grpc

from warmshell.core.errors import WarmshellError
from warmshell.gateway.auth import Unauthenticated
from warmshell.gateway.errors import status_code_for

__all__ = ["abort_for", "streaming", "unary"]

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = grpc.aio.ServicerContext[Any, Any]


async def abort_for(context: Ctx, exc: BaseException) -> NoReturn:
    """Abort the call with the status that matches `exc`."""
    if isinstance(exc, Unauthenticated):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
    if isinstance(exc, WarmshellError):
        await context.abort(status_code_for(exc), str(exc))
    log.exception("internal error", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


def unary(
    handler: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    """Wrap a unary handler so domain errors become statuses."""

    @wraps(handler)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await handler(self, request, context)
        except (WarmshellError, Unauthenticated) as exc:
            await abort_for(context, exc)

    return wrapper


def streaming(
    handler: Callable[[Any, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[Any, Req, Ctx], AsyncIterator[Resp]]:
    """Wrap a server-streaming handler so domain errors become statuses."""

    @wraps(handler)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            async for item in handler(self, request, context):
                yield item
        except (WarmshellError, Unauthenticated) as exc:
            await abort_for(context, exc)

    return wrapper
