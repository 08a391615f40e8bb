"""Exponential backoff with jitter, as data (1 s doubling to 30 s by default)."""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["delays"]


def delays(first: float = 1.0, cap: float = 30.0, factor: float = 2.0) -> Iterator[float]:
    """Endless delays: first, first*factor, ... capped, each with +-10% jitter so that many
    supervisors do not reconnect in lock-step after a gateway restart."""
    delay = first
    while True:
        yield delay * random.uniform(0.9, 1.1)
        delay = min(cap, delay * factor)
