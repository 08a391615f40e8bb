"""Token buckets: a burst, then the refill rate; one key never slows another; bounded memory."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.config import RateLimit
from warmshell.gateway.ratelimits import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_refill_rate() -> None:
    clock = Clock()
    limiter = RateLimiter("registration", RateLimit(per_second=0.5, burst=3), clock=clock)
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    clock.now += 1.9
    assert not limiter.allow("a")
    clock.now += 0.2  # 2.1 s at 0.5/s: one token back
    assert limiter.allow("a")
    assert not limiter.allow("a")


def test_refusals_count_a_run_and_reset_when_a_call_goes_through() -> None:
    clock = Clock()
    limiter = RateLimiter("registration", RateLimit(per_second=1, burst=1), clock=clock)
    assert limiter.refusals("a") == 0
    assert [limiter.refusals("a") for _ in range(3)] == [1, 2, 3]
    clock.now += 1
    assert limiter.refusals("a") == 0
    assert limiter.refusals("a") == 1


def test_keys_have_their_own_buckets() -> None:
    limiter = RateLimiter("registration", RateLimit(per_second=0.1, burst=1), clock=Clock())
    assert limiter.allow("looping")
    assert not limiter.allow("looping")
    assert limiter.allow("someone-else")


def test_the_number_of_buckets_is_bounded() -> None:
    limiter = RateLimiter("registration", RateLimit(per_second=1, burst=1), clock=Clock(), max_keys=100)
    for i in range(1000):
        limiter.allow(f"k{i}")
    assert len(limiter) <= 100


@given(st.lists(st.floats(min_value=0, max_value=10), max_size=200))
def test_never_more_than_burst_plus_rate_times_elapsed(gaps: list[float]) -> None:
    clock = Clock()
    limit = RateLimit(per_second=2, burst=4)
    limiter = RateLimiter("token_refresh", limit, clock=clock)
    start = clock.now
    allowed = 0
    for gap in gaps:
        clock.now += gap
        allowed += limiter.allow("k")
    assert allowed <= limit.burst + limit.per_second * (clock.now - start) + 1e-9
