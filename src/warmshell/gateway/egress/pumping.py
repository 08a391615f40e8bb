"""Moving a proxied connection's bytes one way, under its sandbox's byte rate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["CHUNK", "TokenBucket", "pump"]

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
            count(len(data))
            writer.write(data)
            await writer.drain()
            wait = bucket.delay(len(data))
            if wait > 0:
                await asyncio.sleep(wait)
        if writer.can_write_eof():
            writer.write_eof()
    except ConnectionError:
        writer.close()
