"""The doubling backoff: within its bounds, doubling until the cap, then the cap, for any count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.backoff import doubling_delay

delays = st.floats(min_value=0, max_value=1e6, allow_nan=False)
counts = st.integers(min_value=-5, max_value=10**6)


@given(failures=counts, first=delays, cap=delays)
def test_the_delay_is_never_negative_nor_past_the_cap(failures: int, first: float, cap: float) -> None:
    assert 0 <= doubling_delay(failures, first=first, cap=cap) <= cap


@given(failures=st.integers(min_value=1, max_value=2000), first=delays, cap=delays)
def test_it_doubles_until_the_cap_and_then_stays_there(failures: int, first: float, cap: float) -> None:
    now = doubling_delay(failures, first=first, cap=cap)
    after = doubling_delay(failures + 1, first=first, cap=cap)
    assert after >= now
    assert after == min(cap, 2 * now) or now == cap


@given(first=delays, cap=delays)
def test_one_failure_or_none_waits_the_first_delay(first: float, cap: float) -> None:
    assert doubling_delay(1, first=first, cap=cap) == doubling_delay(0, first=first, cap=cap) == min(first, cap)


def test_the_figures_the_pools_wait() -> None:
    assert [doubling_delay(n, first=1.0, cap=60.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert doubling_delay(5000, first=1.0, cap=60.0) == 60.0  # 2 ** 4999 as a float would raise


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 0 seconds"):
        doubling_delay(1, first=-1.0, cap=60.0)
