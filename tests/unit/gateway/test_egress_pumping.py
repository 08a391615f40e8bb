"""The per-sandbox byte rate of the egress proxy (a token bucket on an injected clock)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.gateway.egress.pumping import TokenBucket


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_second_of_burst_then_the_rate() -> None:
    clock = _Clock()
    bucket = TokenBucket(1000, clock=clock)
    assert bucket.delay(1000) == 0.0
    assert bucket.delay(500) == 0.5
    clock.now = 0.5
    assert bucket.delay(0) == 0.0


@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(0, 2)), min_size=1, max_size=50))
def test_waiting_as_told_never_exceeds_the_rate_plus_the_burst(takes: list[tuple[int, float]]) -> None:
    clock = _Clock()
    bucket = TokenBucket(1000, clock=clock)
    sent = 0
    for size, pause in takes:
        sent += size
        clock.now += bucket.delay(size) + pause
        assert sent <= 1000 * (clock.now + 1) + 1e-6 * sent
