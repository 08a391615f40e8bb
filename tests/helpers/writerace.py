"""The status a refused request stream reports to a caller whose writes race the refusal.

grpcio's asyncio client (grpc/grpc#36066) replaces the server's status with INTERNAL ("Internal
error from Core") when one of its writes starts after the server ended the call. The window is
the server's answer in flight, a few milliseconds over a local socket, so each attempt here
writes its messages after a delay spread over the first 4 ms, two attempts at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

__all__ = ["codes_of_racing_writes"]

# 40 delays 0.1 ms apart, two calls at each: every refusal fixed with this harness came back
# INTERNAL at least once in these 80 calls before its fix.
_DELAYS = [i / 10_000 for i in range(40)]


async def _after(delay: float, messages: Sequence[Any]) -> AsyncIterator[Any]:
    await asyncio.sleep(delay)
    for message in messages:
        yield message


async def _code_of(call: Any) -> grpc.StatusCode:
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def codes_of_racing_writes(
    open_call: Callable[[AsyncIterator[Any]], Any], messages: Sequence[Any] | Callable[[], Sequence[Any]]
) -> list[grpc.StatusCode]:
    """The status of each of 80 calls of `open_call`, each sending `messages` (or what that
    function makes for each call), then its half-close, after one of the spread delays."""
    made = messages if callable(messages) else lambda: messages
    codes: list[grpc.StatusCode] = []
    for delay in _DELAYS:
        pair = await asyncio.gather(
            _code_of(open_call(_after(delay, made()))), _code_of(open_call(_after(delay, made())))
        )
        codes.extend(pair)
    return codes
