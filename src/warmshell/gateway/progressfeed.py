"""Progress lines shared between gateway replicas, so that a watch on any replica sees every line
of a create (issue 20): "PoolHit" and "Created" are said by the replica that made the create,
"Registered" and "Claimed" by the one holding the pod's registration.

Lines a replica's driver says of its own accord are sent to the others on the store's
notification channel (Postgres NOTIFY: no table write, nothing kept), batched per turn of the
event loop; a replica hearing another's line publishes it to its own watchers. Lines every
replica's driver observes itself (Kubernetes Events, from a watch every replica runs) are never
sent, or each watcher would see them once per replica. Best effort, like the lines themselves: a
batch that cannot be sent is dropped with a log line, never retried (the store being down is
reported elsewhere, and the record's phase does not depend on progress).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from warmshell.core.ids import SandboxId
from warmshell.core.models import now_ms
from warmshell.drivers.base import ProgressLine
from warmshell.gateway.events import EventBus, Progress

__all__ = ["MAX_MESSAGE_CHARS", "MAX_REASON_CHARS", "ProgressFeed", "decode", "encode"]

log = logging.getLogger(__name__)

# NOTIFY payloads are limited to 8000 bytes; progress lines are a word and one line of text. At
# these lengths even a line of escaped control characters (6 bytes each) fits.
MAX_REASON_CHARS = 100
MAX_MESSAGE_CHARS = 1000
MAX_BATCH = 256


def encode(origin: str, sandbox_id: SandboxId, line: Progress) -> str:
    """One line as a notification payload."""
    return json.dumps(
        {
            "o": origin,
            "s": sandbox_id,
            "t": line.timestamp_ms,
            "r": line.reason[:MAX_REASON_CHARS],
            "m": line.message[:MAX_MESSAGE_CHARS],
            "w": line.warning,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def decode(payload: str) -> tuple[str, SandboxId, Progress] | None:
    """(origin replica, sandbox, line) from a payload; None for one this version cannot read."""
    try:
        data = json.loads(payload)
        line = Progress(int(data["t"]), str(data["r"]), str(data["m"]), bool(data["w"]))
        return str(data["o"]), SandboxId(str(data["s"])), line
    except (ValueError, KeyError, TypeError):
        return None


class ProgressFeed:
    """This replica's side of the shared progress lines: `share` what its driver said, `heard`
    what the store's channel delivered."""

    def __init__(self, replica_id: str, bus: EventBus, notify: Callable[[list[str]], Awaitable[None]]) -> None:
        """`notify` sends payloads on the channel (`PostgresStore.notify_progress`)."""
        self._me = replica_id
        self._bus = bus
        self._notify = notify
        self._queue: list[str] = []
        self._ready = asyncio.Event()

    def share(self, sandbox_id: SandboxId, line: ProgressLine) -> None:
        """Queue a line this replica's driver said (not one every replica observes itself)."""
        if line.seen_by_every_replica:
            return
        self._queue.append(encode(self._me, sandbox_id, Progress(now_ms(), line.reason, line.message, line.warning)))
        self._ready.set()

    def heard(self, payload: str) -> None:
        """A line from the channel: published here unless this replica said it."""
        decoded = decode(payload)
        if decoded is None:
            log.debug("ignored a progress payload this version cannot read")
            return
        origin, sandbox_id, line = decoded
        if origin != self._me:
            self._bus.publish(sandbox_id, line)

    async def run(self) -> None:
        """Send queued lines until cancelled, everything queued so far in one call."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            if self._queue:
                self._ready.set()
            try:
                await self._notify(batch)
            except Exception as exc:  # whatever the database client raised: the feed goes on
                log.warning("could not share %d progress line(s) with the other replicas: %s", len(batch), exc)
