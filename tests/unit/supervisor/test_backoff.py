"""The supervisor's reconnect policy: the first retry at once (jittered), then the backoff."""

from __future__ import annotations

import itertools
import random

from warmshell.supervisor.backoff import FIRST_RETRY_JITTER_SECONDS, delays, reconnect_delays


def test_first_reconnect_is_immediate_then_backs_off() -> None:
    waits = list(itertools.islice(reconnect_delays(first=1.0, cap=8.0), 7))
    assert 0.0 <= waits[0] <= FIRST_RETRY_JITTER_SECONDS
    for wait, step in zip(waits[1:], [1.0, 2.0, 4.0, 8.0, 8.0, 8.0], strict=True):
        assert step * 0.9 <= wait <= step * 1.1


def test_first_retries_of_many_supervisors_spread_over_the_window() -> None:
    random.seed(20)
    firsts = [next(reconnect_delays()) for _ in range(200)]
    assert min(firsts) < FIRST_RETRY_JITTER_SECONDS * 0.1
    assert max(firsts) > FIRST_RETRY_JITTER_SECONDS * 0.9
    assert len(set(firsts)) == len(firsts)  # not in lock-step


def test_plain_backoff_still_starts_at_first() -> None:
    assert 0.9 <= next(delays()) <= 1.1
