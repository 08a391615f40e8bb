"""Moving a proxied connection's bytes one way, under its sandbox's byte rate."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from warmshell.gateway.egress.heads import CHUNKED, BadRequest

__all__ = ["CHUNK", "TokenBucket", "copy_body", "pump"]

CHUNK = 64 * 1024


class TokenBucket:
    """A byte rate shared by every connection of one sandbox, one direction: a second's worth
    of burst, then `rate` bytes per second."""

    def __init__(self, rate: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._clock = clock
        self._tokens = float(rate)
        self._stamp = clock()

    def delay(self, size: int) -> float:
        """Take `size` bytes; how long to wait before the next take so the rate holds."""
        now = self._clock()
        self._tokens = min(float(self._rate), self._tokens + (now - self._stamp) * self._rate) - size
        self._stamp = now
        return max(0.0, -self._tokens / self._rate)


async def pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bucket: TokenBucket, count: Callable[[int], None]
) -> None:
    """Copy until end of stream (then half-close the writer) or a broken connection."""
    try:
        while data := await reader.read(CHUNK):
            await _send(writer, data, bucket=bucket, count=count)
        if writer.can_write_eof():
            writer.write_eof()
    except ConnectionError:
        writer.close()


async def copy_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    length: int,
    bucket: TokenBucket,
    count: Callable[[int], None],
) -> None:
    """Copy one request body framed as `length` (`heads.body_length`), no further: what follows
    is the next request's head. BadRequest for a malformed chunk size line."""
    send = functools.partial(_send, writer, bucket=bucket, count=count)
    if length != CHUNKED:
        await _copy_exactly(reader, length, send)
        return
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.partition(b";")[0].strip(), 16)
        except ValueError:
            raise BadRequest(400, "a malformed chunk size") from None
        await send(line)
        if size == 0:
            break
        await _copy_exactly(reader, size + 2, send)  # the chunk and its CRLF
    while True:  # trailer fields, then the blank line
        line = await reader.readuntil(b"\r\n")
        await send(line)
        if line == b"\r\n":
            return


async def _copy_exactly(reader: asyncio.StreamReader, size: int, send: Callable[[bytes], Awaitable[None]]) -> None:
    """Copy `size` bytes (IncompleteReadError when the stream ends first)."""
    while size > 0:
        data = await reader.readexactly(min(size, CHUNK))
        size -= len(data)
        await send(data)


async def _send(
    writer: asyncio.StreamWriter, data: bytes, *, bucket: TokenBucket, count: Callable[[int], None]
) -> None:
    count(len(data))
    writer.write(data)
    await writer.drain()
    wait = bucket.delay(len(data))
    if wait > 0:
        await asyncio.sleep(wait)
