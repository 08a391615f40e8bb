"""The event loop's resource-exhaustion errors (an accept that found no descriptor or memory:
EMFILE, ENFILE, ENOBUFS, ENOMEM), logged once per interval with a count.

asyncio reports each failed accept to the loop's exception handler with a traceback, and after
one it still tries the rest of the listener's backlog (up to 100 accepts per wake-up), each
failing alike: with the descriptors gone this once wrote 406,398 tracebacks (206 MB of log) in a
minute, which cost more than the flood that caused it.
The gateway's only asyncio listener is its HTTP port (gRPC accepts in its own core)."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["EXHAUSTION_ERRNOS", "INTERVAL_SECONDS", "Throttle", "install"]

log = logging.getLogger(__name__)

EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
INTERVAL_SECONDS = 10.0


class Throttle:
    """Counts events; says when to report them: the first at once, then at most one report per
    `interval_seconds`, carrying how many happened since the last report (no clock of its own:
    the caller passes the time)."""

    def __init__(self, interval_seconds: float) -> None:
        self._interval = interval_seconds
        self._last: float | None = None
        self._pending = 0

    def record(self, now: float) -> int | None:
        """Count one event at `now`; the number to report now, or None to keep counting."""
        self._pending += 1
        if self._last is not None and now - self._last < self._interval:
            return None
        self._last, count, self._pending = now, self._pending, 0
        return count


def install(loop: asyncio.AbstractEventLoop, *, interval_seconds: float = INTERVAL_SECONDS) -> Callable[[], None]:
    """Make `loop` log its resource-exhaustion errors through a `Throttle` (everything else goes
    to the handler it had); returns the function that puts that handler back."""
    previous = loop.get_exception_handler()
    throttle = Throttle(interval_seconds)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in EXHAUSTION_ERRNOS:
            count = throttle.record(loop.time())
            if count is not None:
                log.error(
                    "%s: %s (%d time(s) since the last report; reported at most every %g s)",
                    context.get("message", "out of resources"),
                    exc.strerror or exc,
                    count,
                    interval_seconds,
                )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    return lambda: loop.set_exception_handler(previous)
