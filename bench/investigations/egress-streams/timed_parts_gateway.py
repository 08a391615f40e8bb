"""`python -m warmshell ...` with the pieces a secret adds to a create timed where they run, without
a profiler's cost: each wrapped function's calls and its thread's CPU time (synchronous functions
only, so no other task's time is counted), per kind of create. SIGRTMIN+K counts into kind K
(0-3) from then on, SIGUSR2 stops counting, SIGUSR1 writes every kind's counts as JSON to the file
named by `WARMSHELL_TIMED`."""

from __future__ import annotations

import collections
import functools
import json
import os
import runpy
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from warmshell.core import egress
from warmshell.gateway.egress import gate, placeholders
from warmshell.gateway.secretvault import SecretVault

_SLOTS = 4
_counts: list[dict[str, list[int]]] = [collections.defaultdict(lambda: [0, 0]) for _ in range(_SLOTS)]
_slot: list[int | None] = [None]


def _timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            slot = _slot[0]
            if slot is not None:
                entry = _counts[slot][name]
                entry[0] += 1
                entry[1] += time.thread_time_ns() - start

    return run


class _TimedAead:
    """The vault's AES-GCM with its encrypt and decrypt timed."""

    def __init__(self, aead: Any) -> None:
        self.encrypt = _timed("AESGCM.encrypt", aead.encrypt)
        self.decrypt = _timed("AESGCM.decrypt", aead.decrypt)


def _wrap() -> None:
    gate._link_shared_trust = _timed("gate._link_shared_trust (the system bundle's relink)", gate._link_shared_trust)
    placeholders.make = _timed("placeholders.make", placeholders.make)
    egress.parse_secret_host = _timed("egress.parse_secret_host", egress.parse_secret_host)
    SecretVault._seal = _timed("SecretVault._seal (with AESGCM.encrypt)", SecretVault._seal)  # type: ignore[method-assign]
    init = SecretVault.__init__

    def timed_init(self: SecretVault, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._aead = _TimedAead(self._aead)  # type: ignore[assignment]

    SecretVault.__init__ = timed_init  # type: ignore[method-assign]


def _count(slot: int | None) -> None:
    _slot[0] = slot


def _dump(_signum: int, _frame: FrameType | None) -> None:
    _slot[0] = None
    with open(os.environ["WARMSHELL_TIMED"], "w") as out:
        json.dump([dict(counts) for counts in _counts], out)


if __name__ == "__main__":
    _wrap()
    for number in range(_SLOTS):
        signal.signal(signal.SIGRTMIN + number, lambda _s, _f, slot=number: _count(slot))
    signal.signal(signal.SIGUSR2, lambda _s, _f: _count(None))
    signal.signal(signal.SIGUSR1, _dump)
    sys.argv = ["warmshell", *sys.argv[1:]]
    runpy.run_module("warmshell", run_name="__main__", alter_sys=True)
