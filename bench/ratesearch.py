"""The sustained-rate search of `replicas.py --parts sustained`, as pure decisions: which rate to
try next, and whether the pool's refills kept up with a step's creates.

The search doubles from a start rate until a step fails (or the cap holds), then bisects between
the highest rate that held and the lowest that failed until they are `resolution` apart. A step
holds when no create failed or went cold, Ready p99 stayed under its limit, and the refills kept
up: the pool's deficit of idle members (pool - idle) did not keep growing while the creates
arrived. A deficit that holds steady (about rate x the time a refill takes) is a pool keeping up;
one that grows at g pods/s is refills short of arrivals by g/s, which a pool of P hides for P/g
seconds before creates go cold — so a 60 s step with a pool of 30 can pass every create warm at a
rate the host cannot sustain, unless the trend is checked. A pool that ran dry fails the step
too (its deficit cannot grow past the pool, so the trend no longer shows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Search", "deficit_growth_per_second", "rate_token", "refills_kept_up"]

# Refills may fall short of arrivals by this share of the rate (sampling noise, the last refills
# of a step still starting) before a step counts as not keeping up.
REFILL_SHORTFALL_SHARE = 0.05
# ... or by this many pods over the span the trend is measured on, whichever is larger.
REFILL_NOISE_PODS = 3.0


def rate_token(rate: float) -> str:
    """A rate as a DNS-label-safe token for sandbox names: 3.5 -> "3p5". Sandbox names are
    DNS-1123 labels, and "s3.5-0" made every create of a fractional rate fail INVALID_ARGUMENT
    (the all-failed midpoint of an earlier search)."""
    return f"{rate:g}".replace(".", "p")


def deficit_growth_per_second(samples: Sequence[tuple[float, int]], pool: int, start: float, end: float) -> float:
    """How fast the pool's deficit grew while creates arrived in [start, end): the mean deficit
    (pool - idle) over the window's last quarter minus that over its second quarter, per second
    between their midpoints. The first quarter is left out: it is the ramp from a full pool to the
    steady deficit. NaN when a quarter has no sample."""
    span = end - start

    def mean_deficit(lo: float, hi: float) -> float:
        inside = [pool - idle for t, idle in samples if start + lo * span <= t < start + hi * span]
        return sum(inside) / len(inside) if inside else float("nan")

    return (mean_deficit(0.75, 1.0) - mean_deficit(0.25, 0.5)) / (0.5 * span)


def refills_kept_up(growth_per_second: float, rate: float, window_seconds: float) -> bool:
    """Whether a deficit growing at `growth_per_second` is refills keeping up with `rate`: short
    by at most REFILL_SHORTFALL_SHARE of it, or REFILL_NOISE_PODS over the measured span. A
    deficit not measured (NaN) did not keep up."""
    allowed = max(REFILL_SHORTFALL_SHARE * rate, REFILL_NOISE_PODS / (0.5 * window_seconds))
    return growth_per_second <= allowed


@dataclass
class Search:
    """Doubling from `start`, then bisection; `next_rate()` is None once the answer is known to
    `resolution` (or the cap held, or `max_steps` ran)."""

    start: float
    cap: float
    resolution: float
    max_steps: int = 8
    held: float = 0.0  # the highest rate that held (0: none yet)
    failed: float | None = None  # the lowest rate that failed
    tried: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.start <= self.cap:
            raise ValueError(f"start rate {self.start:g} must be > 0 and at most the cap {self.cap:g}")
        if self.resolution <= 0:
            raise ValueError(f"resolution {self.resolution:g} must be > 0")

    def record(self, rate: float, kept_up: bool) -> None:
        """The outcome of one step."""
        self.tried.append((rate, kept_up))
        if kept_up:
            self.held = max(self.held, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)

    def next_rate(self) -> float | None:
        """The rate to try next, or None when the search is done."""
        if len(self.tried) >= self.max_steps:
            return None
        if not self.tried:
            return self.start
        if self.failed is None:
            return None if self.held >= self.cap else min(self.held * 2, self.cap)
        if self.failed - self.held <= self.resolution:
            return None
        return round((self.held + self.failed) / 2, 2)
