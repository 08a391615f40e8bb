"""Which warm pool serves a create request: a pure lookup by fingerprint.

Drivers keep their pools in a `PoolIndex` rebuilt whenever pools change, and look every create up
in it: `NotReady` (no pools known yet), `NoMatch`, `Match(pool)` or `Ambiguous(pools)`. Only a
`Match` goes warm; everything else goes cold, and the result names the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from warmshell.core.ids import Fingerprint

__all__ = ["Ambiguous", "Match", "MatchResult", "NoMatch", "NotReady", "PoolIndex"]

P = TypeVar("P")


@dataclass(frozen=True)
class NotReady:
    """The driver does not know its pools yet (not synced)."""


@dataclass(frozen=True)
class NoMatch:
    """No pool has the request's fingerprint."""


@dataclass(frozen=True)
class Match(Generic[P]):
    """Exactly one pool has the request's fingerprint."""

    pool: P


@dataclass(frozen=True)
class Ambiguous(Generic[P]):
    """Several pools have the request's fingerprint; none is chosen (operators must fix it)."""

    pools: tuple[P, ...]


MatchResult = NotReady | NoMatch | Match[P] | Ambiguous[P]


class PoolIndex(Generic[P]):
    """Pools by fingerprint: a lookup costs the same with one pool or thousands."""

    def __init__(self, pools: Iterable[tuple[Fingerprint, P]] | None = None) -> None:
        """`pools=None` is an index that is not synced yet: every lookup is NotReady."""
        self._synced = pools is not None
        self._by_fingerprint: dict[Fingerprint, list[P]] = {}
        for fp, pool in pools or ():
            self._by_fingerprint.setdefault(fp, []).append(pool)

    @property
    def synced(self) -> bool:
        """Whether lookups answer from real data."""
        return self._synced

    def lookup(self, fp: Fingerprint) -> MatchResult[P]:
        """The pools that could serve a request with this fingerprint."""
        if not self._synced:
            return NotReady()
        found = self._by_fingerprint.get(fp, ())
        if not found:
            return NoMatch()
        if len(found) == 1:
            return Match(found[0])
        return Ambiguous(tuple(found))
