"""Upstream servers for egress tests, on host loopback addresses a sandbox's own loopback does
not reach (127.0.0.2, 127.0.0.3): each answers any request with what it was asked, and counts
the connections it holds open (to see the proxy cut them)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class Upstream:
    """A running upstream: its address, the heads it received, the connections it holds."""

    host: str
    port: int = 0
    heads: list[bytes] = field(default_factory=list)
    open_connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


@asynccontextmanager
async def upstream(host: str = "127.0.0.2", tls: ssl.SSLContext | None = None) -> AsyncIterator[Upstream]:
    """An HTTP/1.1 server: `GET /hold` keeps the connection open (sending one line) until the
    other side closes it; any other request is answered `upstream saw <path>` and closed."""
    state = Upstream(host)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.open_connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            state.heads.append(head)
            path = head.split(b" ")[1]
            if path == b"/hold":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nholding\n")
                await writer.drain()
                await reader.read()  # until the proxy cuts it
            else:
                body = b"upstream saw " + path + b"\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            state.open_connections -= 1
            state.closed.set()
            writer.close()

    server = await asyncio.start_server(serve, host, 0, ssl=tls)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        await server.wait_closed()
