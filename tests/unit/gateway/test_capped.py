"""The HTTP port's connection cap: past it, the oldest connection that has sent nothing makes
room (else the oldest), and the protocol behind it sees every event of the ones it serves."""

from __future__ import annotations

import asyncio

from warmshell.gateway.capped import CappedProtocols


class Transport(asyncio.Transport):
    """Records whether the cap aborted it."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Served(asyncio.Protocol):
    """What the wrapped factory makes: keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append(data.decode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")


def connect(cap: CappedProtocols) -> tuple[asyncio.Protocol, Transport]:
    protocol, transport = cap(), Transport()
    protocol.connection_made(transport)
    return protocol, transport


def test_past_the_cap_the_oldest_silent_connection_makes_room() -> None:
    served: list[Served] = []

    def serve() -> Served:
        served.append(Served())
        return served[-1]

    cap = CappedProtocols(serve, limit=3)
    speaking, _ = connect(cap)
    speaking.data_received(b"GET")
    _, silent_old = connect(cap)
    _, silent_new = connect(cap)
    connect(cap)  # the fourth
    assert (silent_old.aborted, silent_new.aborted, cap.evicted) == (True, False, 1)
    assert served[0].events == ["made", "GET"]  # the one that spoke is kept


def test_when_every_connection_has_spoken_the_oldest_makes_room() -> None:
    cap = CappedProtocols(Served, limit=2)
    transports = []
    for _ in range(2):
        protocol, transport = connect(cap)
        protocol.data_received(b"x")
        transports.append(transport)
    connect(cap)
    assert [t.aborted for t in transports] == [True, False]


def test_a_closed_connection_gives_its_place_back() -> None:
    cap = CappedProtocols(Served, limit=2)
    first, _ = connect(cap)
    _, second = connect(cap)
    first.connection_lost(None)
    assert len(cap) == 1
    connect(cap)
    assert (second.aborted, cap.evicted, len(cap)) == (False, 0, 2)
