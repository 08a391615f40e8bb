"""Warm pools that share a shape. A create that matches one of them matches them all, so its
lookup is Ambiguous and it goes cold: every driver flags such pools where it loads them (a log
warning) and in `pool list` (a condition), so an operator sees why a pool never serves."""

from __future__ import annotations

from collections.abc import Iterable

from warmshell.core.ids import Fingerprint

__all__ = ["CONDITION_TYPE", "REASON", "shared_shape_message", "shared_shapes"]

CONDITION_TYPE = "Unambiguous"
REASON = "SharedShape"


def shared_shapes(pools: Iterable[tuple[str, Fingerprint]]) -> dict[str, tuple[str, ...]]:
    """For each named pool whose fingerprint another pool has too, those others' names (sorted);
    pools with a shape of their own are left out. Empty fingerprints (invalid pools) never match."""
    by_fingerprint: dict[Fingerprint, list[str]] = {}
    for name, fingerprint in pools:
        if fingerprint:
            by_fingerprint.setdefault(fingerprint, []).append(name)
    shared: dict[str, tuple[str, ...]] = {}
    for names in by_fingerprint.values():
        if len(names) > 1:
            for name in names:
                shared[name] = tuple(sorted(n for n in names if n != name))
    return shared


def shared_shape_message(others: Iterable[str], fingerprint: Fingerprint) -> str:
    """What is wrong and what to do, for the condition and the log."""
    return (
        f"same shape (fingerprint {fingerprint[:12]}) as {', '.join(others)}: every create of this shape "
        "is Ambiguous and goes cold; change or remove one of the profiles"
    )
