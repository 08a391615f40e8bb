"""Host uids for sandboxes when the gateway runs as root: each live sandbox gets its own.

A sandbox's processes then share nothing with another's or with the gateway's at the uid level
(signals, per-uid limits, file ownership), on top of the user namespace bwrap makes for it. The
range is configured (`local.sandbox_uid_base`, `local.sandbox_uid_count`) and should be unused
on the host; within it a uid is picked at random among the free ones, so two gateways sharing a
range rarely pick the same one (which the namespaces would still keep apart).
"""

from __future__ import annotations

import secrets

from warmshell.core.errors import UnavailableError

__all__ = ["UidRange"]


class UidRange:
    """The free and taken uids of one range."""

    def __init__(self, base: int, count: int) -> None:
        self.base = base
        self.count = count
        self._taken: set[int] = set()

    def acquire(self) -> int:
        """A uid no live sandbox of this gateway has; UnavailableError when none is left."""
        if len(self._taken) >= self.count:
            raise UnavailableError(f"all {self.count} sandbox uids from {self.base} are in use")
        while True:
            uid = self.base + secrets.randbelow(self.count)
            if uid not in self._taken:
                self._taken.add(uid)
                return uid

    def release(self, uid: int) -> None:
        """Give a uid back (idempotent)."""
        self._taken.discard(uid)
