"""A log of served API requests and counters per (user, verb, resource) for tests and benchmarks."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One served request."""

    at: float
    user: str
    verb: str
    resource: str  # "pods", "sandboxes.agents.x-k8s.io", "pods/status", "" for non-resource paths
    namespace: str
    name: str
    code: int
    seconds: float
    path: str


class RequestLog:
    """The last ``capacity`` requests plus unbounded counters."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.entries: deque[Entry] = deque(maxlen=capacity)
        self.counters: Counter[tuple[str, str, str]] = Counter()

    def record(self, entry: Entry) -> None:
        """Add a served request."""
        self.entries.append(entry)
        self.counters[(entry.user, entry.verb, entry.resource)] += 1

    def count(self, *, verb: str | None = None, resource: str | None = None, user: str | None = None) -> int:
        """How many requests matched (``None`` matches anything)."""
        return sum(
            n
            for (u, v, r), n in self.counters.items()
            if (verb is None or v == verb) and (resource is None or r == resource) and (user is None or u == user)
        )

    def clear(self) -> None:
        """Forget everything."""
        self.entries.clear()
        self.counters.clear()

    def snapshot(self) -> list[dict[str, object]]:
        """Counters as JSON-friendly rows."""
        return [{"user": u, "verb": v, "resource": r, "count": n} for (u, v, r), n in sorted(self.counters.items())]


def now() -> float:
    """Wall-clock time for entries."""
    return time.time()
