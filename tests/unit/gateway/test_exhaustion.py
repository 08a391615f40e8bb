"""Resource-exhaustion errors of the event loop are logged once per interval with a count, and
every other loop error still reaches the handler that was there before."""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.gateway import exhaustion


def test_the_first_is_reported_then_one_report_per_interval_with_the_count() -> None:
    throttle = exhaustion.Throttle(10.0)
    assert throttle.record(100.0) == 1
    assert [throttle.record(100.0 + i / 10) for i in range(1, 50)] == [None] * 49
    assert throttle.record(110.0) == 50  # the 49 held back, and this one
    assert throttle.record(110.5) is None


@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=200))
def test_every_event_is_counted_once_and_reports_are_an_interval_apart(offsets: list[float]) -> None:
    throttle = exhaustion.Throttle(10.0)
    times = sorted(offsets)
    reports = [(t, n) for t in times if (n := throttle.record(t)) is not None]
    assert sum(n for _, n in reports) + throttle._pending == len(times)
    assert all(b[0] - a[0] >= 10.0 for a, b in itertools.pairwise(reports))


async def test_a_flood_of_failed_accepts_logs_a_few_lines(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    others: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: others.append(context))
    restore = exhaustion.install(loop, interval_seconds=60)
    try:
        with caplog.at_level(logging.ERROR, logger=exhaustion.__name__):
            for _ in range(10_000):
                exc = OSError(errno.EMFILE, "Too many open files")
                loop.call_exception_handler({"message": "socket.accept() out of system resource", "exception": exc})
            loop.call_exception_handler({"message": "something else", "exception": ValueError("x")})
    finally:
        restore()
    assert [r.getMessage() for r in caplog.records] == [
        "socket.accept() out of system resource: Too many open files "
        "(1 time(s) since the last report; reported at most every 60 s)"
    ]
    assert [c["message"] for c in others] == ["something else"]
    assert loop.get_exception_handler() is not None  # the test's own handler is back
    loop.set_exception_handler(None)
