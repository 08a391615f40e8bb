"""Exponential backoff with jitter, as data (1 s doubling to 30 s by default), and the
supervisor's reconnect policy built on it: the first retry goes at once, the backoff only after.

A supervisor whose gateway replica went away reaches a survivor through the Service on its first
retry (a survivor holds it until a replica that died is presumed dead); waiting a full backoff
step before even trying added up to a second to every failover, and all of a graceful one. The
first retry is jittered over a short window so that the hundreds of supervisors a replica held do
not arrive in the same instant."""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["FIRST_RETRY_JITTER_SECONDS", "delays", "reconnect_delays"]

# The window the first (immediate) retry is spread over.
FIRST_RETRY_JITTER_SECONDS = 0.1


def delays(first: float = 1.0, cap: float = 30.0, factor: float = 2.0) -> Iterator[float]:
    """Endless delays: first, first*factor, ... capped, each with +-10% jitter so that many
    supervisors do not reconnect in lock-step after a gateway restart."""
    delay = first
    while True:
        yield delay * random.uniform(0.9, 1.1)
        delay = min(cap, delay * factor)


def reconnect_delays(
    first: float = 1.0, cap: float = 30.0, factor: float = 2.0, *, jitter: float = FIRST_RETRY_JITTER_SECONDS
) -> Iterator[float]:
    """The waits before each retry of a lost connection: the first uniformly in [0, jitter]
    (at once, spread out), then `delays(first, cap, factor)`."""
    yield random.uniform(0.0, jitter)
    yield from delays(first, cap, factor)
