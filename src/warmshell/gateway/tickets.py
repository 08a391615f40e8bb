"""One-time tickets for the byte stream: what a ticket allows, and the book that issues and
takes them.

A ticket is its own credential on the byte stream (which has no bearer token), so it is made
as one: 256 random bits, accepted once (taking it removes it), for one sandbox, one path and
one direction, for a few seconds. The book keeps only the SHA-256 of each ticket (a ticket is
never stored, logged or compared as itself), so finding one takes no time that depends on a
stored ticket's bytes. At most
`max_outstanding` wait; past it the oldest is dropped, so a client issuing tickets it never
uses holds a bounded amount of memory.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from warmshell.core.ids import SandboxId
from warmshell.core.transfers import TICKET_BYTES

__all__ = ["Direction", "Grant", "TicketBook"]


class Direction(Enum):
    """Which way the bytes go."""

    UPLOAD = "upload"
    DOWNLOAD = "download"
    UPLOAD_ARCHIVE = "upload-archive"
    DOWNLOAD_ARCHIVE = "download-archive"


@dataclass(frozen=True)
class Grant:
    """What one ticket allows: `size` bytes exactly for an upload, at most `max_bytes` for a
    download (for an archive, the bound of its files' bytes); `mode` and `make_parents` as a
    WriteFile header says them."""

    sandbox_id: SandboxId
    path: str
    direction: Direction
    size: int
    max_bytes: int
    mode: int = 0o644
    make_parents: bool = True


class TicketBook:
    """Issues tickets and takes them back once. Not thread-safe: the gateway's event loop owns it."""

    def __init__(self, *, ttl_seconds: float, clock: Callable[[], float], max_outstanding: int = 10_000) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._max = max_outstanding
        self._grants: OrderedDict[bytes, tuple[float, Grant]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._grants)

    def issue(self, grant: Grant) -> tuple[bytes, float]:
        """A new ticket for `grant` and the clock time at which it expires."""
        now = self._clock()
        self._drop_expired(now)
        while len(self._grants) >= self._max:
            self._grants.popitem(last=False)
        ticket = secrets.token_bytes(TICKET_BYTES)
        expires = now + self._ttl
        self._grants[_digest(ticket)] = (expires, grant)
        return ticket, expires

    def take(self, ticket: bytes) -> Grant | None:
        """The grant of `ticket`, removed so that it is never accepted again; None for a ticket
        not issued, already taken, or expired."""
        if len(ticket) != TICKET_BYTES:
            return None
        # Looked up by digest: how long the lookup takes depends on the digest of what was sent,
        # never on a ticket's own bytes, so timing teaches a guesser nothing about one.
        entry = self._grants.pop(_digest(ticket), None)
        if entry is None:
            return None
        expires, grant = entry
        return grant if self._clock() < expires else None

    def _drop_expired(self, now: float) -> None:
        # Issued in order with one ttl: the expired ones are at the front.
        while self._grants:
            digest, (expires, _) = next(iter(self._grants.items()))
            if expires > now:
                return
            del self._grants[digest]


def _digest(ticket: bytes) -> bytes:
    return hashlib.sha256(ticket).digest()
