"""A cap on the connections an asyncio server holds. Past it, a new connection takes the place of
the oldest one that has sent nothing yet (or, if every one has, of the oldest), which is closed at
once: the server's descriptors stay bounded (20,000 silent connections to an uncapped HTTP port
once took every descriptor the gateway had), and a flood of silent connections cannot keep a
probe out, since a probe sends its request as soon as it connects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["CappedProtocols"]


class CappedProtocols:
    """A protocol factory for `loop.create_server` that holds at most `limit` connections, each
    served by a protocol `factory` makes; `evicted` counts the connections closed to make room."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], limit: int) -> None:
        self._factory = factory
        self.limit = limit
        self.evicted = 0
        self._live: dict[_Capped, None] = {}  # oldest first

    def __call__(self) -> asyncio.Protocol:
        return _Capped(self)

    def __len__(self) -> int:
        return len(self._live)

    def _admit(self, connection: _Capped) -> asyncio.Protocol:
        if len(self._live) >= self.limit:
            victim = next((c for c in self._live if not c.spoke), next(iter(self._live)))
            self._drop(victim)
            victim.close()
            self.evicted += 1
        self._live[connection] = None
        return self._factory()

    def _drop(self, connection: _Capped) -> None:
        self._live.pop(connection, None)


class _Capped(asyncio.Protocol):
    """One connection, handed to the protocol the factory made for it."""

    def __init__(self, cap: CappedProtocols) -> None:
        self._cap = cap
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self.spoke = False  # has sent at least one byte

    def close(self) -> None:
        """Close the connection without lingering: its descriptor is free at once."""
        if isinstance(self._transport, asyncio.Transport):
            self._transport.abort()
        elif self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._inner = self._cap._admit(self)
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cap._drop(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.spoke = True
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
