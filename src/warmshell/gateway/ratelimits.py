"""Token buckets for the supervisor calls a stolen credential could repeat (registering,
refreshing a sandbox token): each key (an instance, a credential's digest) gets its own bucket,
so one looping caller is slowed without touching anyone else."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from warmshell.core.config import RateLimit

__all__ = ["RateLimiter"]

# Buckets kept at most; past it the full ones (indistinguishable from new) are forgotten first.
MAX_KEYS = 10_000


@dataclass
class _Bucket:
    tokens: float
    updated: float
    refused: int = 0  # refusals since the last call let through


class RateLimiter:
    """`allow(key)` takes one token from `key`'s bucket, refilled at `limit.per_second` up to
    `limit.burst`. `name` says which call it limits (the metric's label); a refused caller is
    kept waiting `refusal_delay_seconds` before it hears so."""

    def __init__(
        self,
        name: str,
        limit: RateLimit,
        *,
        refusal_delay_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.name = name
        self.limit = limit
        self.refusal_delay_seconds = refusal_delay_seconds
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}

    def allow(self, key: str) -> bool:
        """Whether a call under `key` may go ahead now (and count it if so)."""
        return self.refusals(key) == 0

    def refusals(self, key: str) -> int:
        """0 when a call under `key` may go ahead now (and is counted); else how many calls in a
        row have been refused, this one included (so a caller can log only the first)."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            self._make_room(now)
            bucket = self._buckets[key] = _Bucket(float(self.limit.burst), now)
        bucket.tokens = min(float(self.limit.burst), bucket.tokens + (now - bucket.updated) * self.limit.per_second)
        bucket.updated = now
        if bucket.tokens < 1.0:
            bucket.refused += 1
            return bucket.refused
        bucket.tokens -= 1.0
        bucket.refused = 0
        return 0

    def __len__(self) -> int:
        return len(self._buckets)

    def _make_room(self, now: float) -> None:
        if len(self._buckets) < self._max_keys:
            return
        refill_seconds = self.limit.burst / self.limit.per_second
        for key in [k for k, b in self._buckets.items() if now - b.updated >= refill_seconds]:
            del self._buckets[key]
        if len(self._buckets) >= self._max_keys:  # still full: forget the oldest half, never grow
            for key in list(self._buckets)[: self._max_keys // 2]:
                del self._buckets[key]
