"""Which warm pool serves a create request: a pure lookup by fingerprint.

Drivers keep their pools in a `PoolIndex` rebuilt whenever pools change, and look every create up
in it: `NotReady` (no pools known yet), `NoMatch`, `Match(pool)` or `Ambiguous(pools)`. Only a
`Match` goes warm; everything else goes cold, and the result names the reason.

Pools that accept environment keys at activation are grouped by their pattern set: a request is
fingerprinted once per distinct set (without the keys that set accepts) and looked up among that
group, so the cost grows with the number of distinct sets, not of pools. Matches from all groups
count together: more than one is `Ambiguous`, as for pools sharing a shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from warmshell.core.fingerprints import SandboxShape, accepting, fingerprint, pattern_set
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
    """Exactly one pool has the request's fingerprint; `injected` are the request's environment
    keys the pool accepts (left out of the match, set at activation)."""

    pool: P
    injected: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ambiguous(Generic[P]):
    """Several pools have the request's fingerprint; none is chosen (operators must fix it)."""

    pools: tuple[P, ...]


MatchResult = NotReady | NoMatch | Match[P] | Ambiguous[P]


class PoolIndex(Generic[P]):
    """Pools by fingerprint, grouped by the environment patterns they accept: a lookup costs one
    fingerprint per distinct pattern set, however many pools there are."""

    def __init__(
        self,
        pools: Iterable[tuple[Fingerprint, P]] | None = None,
        *,
        accepts: Callable[[P], Sequence[str]] | None = None,
    ) -> None:
        """`pools=None` is an index that is not synced yet: every lookup is NotReady. Each
        fingerprint is the pool's own (its shape with its pattern set, `accepts(pool)`)."""
        self._synced = pools is not None
        self._by_fingerprint: dict[Fingerprint, list[P]] = {}
        sets: set[tuple[str, ...]] = set()
        for fp, pool in pools or ():
            self._by_fingerprint.setdefault(fp, []).append(pool)
            sets.add(pattern_set(accepts(pool)) if accepts else ())
        self._pattern_sets = sorted(sets)

    @property
    def synced(self) -> bool:
        """Whether lookups answer from real data."""
        return self._synced

    def replace(self, fp: Fingerprint, old: P, new: P) -> None:
        """`new` in `old`'s place under `fp`: for a change matching does not see (a pool's
        counts), where rebuilding the index would redo every pool's fingerprint grouping."""
        pools = self._by_fingerprint.get(fp)
        if pools is not None:
            self._by_fingerprint[fp] = [new if pool is old else pool for pool in pools]

    def lookup(self, fp: Fingerprint) -> MatchResult[P]:
        """The pools with exactly this fingerprint (the pattern sets not applied)."""
        if not self._synced:
            return NotReady()
        found = self._by_fingerprint.get(fp, ())
        if not found:
            return NoMatch()
        if len(found) == 1:
            return Match(found[0])
        return Ambiguous(tuple(found))

    def match(self, shape: SandboxShape) -> MatchResult[P]:
        """The pools that could serve a request of this shape, each pattern set applied."""
        if not self._synced:
            return NotReady()
        found: list[tuple[P, tuple[str, ...]]] = []
        for patterns in self._pattern_sets:
            compared, injected = accepting(shape, patterns)
            found.extend((pool, injected) for pool in self._by_fingerprint.get(fingerprint(compared), ()))
        if not found:
            return NoMatch()
        if len(found) == 1:
            return Match(*found[0])
        return Ambiguous(tuple(pool for pool, _ in found))
