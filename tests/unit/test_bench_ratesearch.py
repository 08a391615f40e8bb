"""The sustained-rate search's decisions (`bench/ratesearch.py`): the search converges on the
highest rate that holds, and a pool whose deficit grows is refills not keeping up."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ratesearch


def run(search: ratesearch.Search, holds_up_to: float) -> list[float]:
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate <= holds_up_to)
    return rates


def test_doubles_until_a_rate_fails_then_bisects() -> None:
    search = ratesearch.Search(start=1, cap=16, resolution=0.5)
    assert run(search, holds_up_to=3.2) == [1, 2, 4, 3, 3.5]
    assert (search.held, search.failed) == (3, 3.5)


def test_a_first_step_that_fails_bisects_down_from_it() -> None:
    search = ratesearch.Search(start=2, cap=16, resolution=0.5)
    assert run(search, holds_up_to=0.8) == [2, 1, 0.5]
    assert (search.held, search.failed) == (0.5, 1)


def test_a_cap_that_holds_ends_the_search() -> None:
    search = ratesearch.Search(start=3, cap=8, resolution=0.5)
    assert run(search, holds_up_to=100) == [3, 6, 8]
    assert search.held == 8


def test_max_steps_bounds_the_search() -> None:
    search = ratesearch.Search(start=1, cap=64, resolution=0.01, max_steps=4)
    assert len(run(search, holds_up_to=5)) == 4


@pytest.mark.parametrize(("start", "cap", "resolution"), [(0, 4, 0.5), (5, 4, 0.5), (1, 4, 0)])
def test_a_search_that_cannot_work_is_refused(start: float, cap: float, resolution: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ratesearch.Search(start=start, cap=cap, resolution=resolution)


@given(
    holds_up_to=st.floats(min_value=0.1, max_value=30),
    start=st.floats(min_value=0.5, max_value=8),
    resolution=st.sampled_from([0.25, 0.5, 1.0]),
)
def test_the_answer_brackets_the_true_limit(holds_up_to: float, start: float, resolution: float) -> None:
    search = ratesearch.Search(start=start, cap=32, resolution=resolution, max_steps=30)
    run(search, holds_up_to)
    assert search.held <= holds_up_to
    if search.failed is not None:
        assert search.failed > holds_up_to
        assert search.failed - search.held <= resolution
    else:
        assert search.held == 32


def test_rate_tokens_make_valid_sandbox_names() -> None:
    from warmshell.core.validation import validate_name

    for rate in (1, 3.5, 0.25, 12.75):
        validate_name(f"s{ratesearch.rate_token(rate)}-0")
    assert ratesearch.rate_token(3.5) == "3p5"


def steady(pool: int, deficit: float, growth: float, seconds: float = 60) -> list[tuple[float, int]]:
    """Samples every 0.5 s of a pool whose deficit ramps to `deficit` in 5 s then grows at `growth`/s."""
    samples = []
    for i in range(int(seconds * 2)):
        t = i / 2
        d = deficit * min(t / 5, 1) + growth * max(t - 5, 0)
        samples.append((t, max(0, pool - round(d))))
    return samples


def test_a_steady_deficit_is_refills_keeping_up() -> None:
    growth = ratesearch.deficit_growth_per_second(steady(30, 6, 0), 30, 0, 60)
    assert abs(growth) < 0.05
    assert ratesearch.refills_kept_up(growth, rate=3, window_seconds=60)


def test_a_growing_deficit_is_refills_falling_behind() -> None:
    growth = ratesearch.deficit_growth_per_second(steady(60, 6, 0.4), 60, 0, 60)
    assert growth == pytest.approx(0.4, abs=0.05)
    assert not ratesearch.refills_kept_up(growth, rate=4, window_seconds=60)


def test_no_samples_is_not_kept_up() -> None:
    growth = ratesearch.deficit_growth_per_second([], 30, 0, 60)
    assert math.isnan(growth)
    assert not ratesearch.refills_kept_up(growth, rate=3, window_seconds=60)
