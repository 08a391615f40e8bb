"""The delay before a retry after failures in a row: doubling from a first delay up to a cap, no
jitter (each caller retries one thing of its own: a pool's members, a profile's image build, a
lease's leader task; nothing that many clients retry at once) (pure)."""

from __future__ import annotations

__all__ = ["doubling_delay"]


def doubling_delay(failures: int, *, first: float, cap: float) -> float:
    """Seconds to wait after `failures` failures in a row: `first` after one (or none), twice as
    long after each more, never more than `cap`. Any count is safe: a pool failing once a minute
    for days passes the 1,024 failures where `first * 2 ** (failures - 1)` raises OverflowError."""
    if first < 0 or cap < 0:
        raise ValueError(f"a backoff needs a first delay and a cap of at least 0 seconds, not {first} and {cap}")
    delay = first
    # Doubled step by step, stopping at the cap: at most ~2,100 steps from any positive float.
    for _ in range(max(failures - 1, 0)):
        if delay >= cap or delay == 0:
            break
        delay *= 2
    return min(cap, delay)
