"""The small HTTP side of the gateway: /healthz (readiness: can it serve?), /livez (liveness: is
the process answering at all?) and /metrics (Prometheus text format).

It serves probes and a scraper, so it holds few connections (`MAX_CONNECTIONS`, counted in the
listeners' descriptor budget, `listening.py`), and closes one that has sent no complete request
for `IDLE_SECONDS`, before its first request as after its last: no local process can take the
gateway's descriptors through this port. Request lines and headers are bounded by aiohttp."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from warmshell.gateway import exhaustion, metrics
from warmshell.gateway.capped import CappedProtocols
from warmshell.gateway.listening import HTTP_MAX_CONNECTIONS

__all__ = ["IDLE_SECONDS", "HttpServer", "start_http"]

# A probe or a scrape sends its request at once; a scraper that keeps its connection between
# scrapes (15 s and more apart) simply opens a new one.
IDLE_SECONDS = 5.0


@dataclass
class HttpServer:
    """The running HTTP side: its listener and the aiohttp runner behind it."""

    server: asyncio.Server
    runner: web.AppRunner
    connections: CappedProtocols
    restore_loop_handler: Callable[[], None]

    async def cleanup(self) -> None:
        """Stop listening, then close the connections and the application."""
        self.server.close()
        await self.runner.cleanup()
        await self.server.wait_closed()
        self.restore_loop_handler()


async def start_http(
    host: str,
    port: int,
    healthy: Callable[[], Awaitable[str | None]],
    *,
    before_metrics: Callable[[], Awaitable[None]] | None = None,
) -> tuple[HttpServer, int]:
    """Serve health and metrics; returns the server (for cleanup) and the bound port.

    `healthy()` returns None when all is well, else the reason it is not. `/livez` is always 200
    while the process answers: it does not depend on the store, so a gateway waiting for its
    database (NotServing on `/healthz`) is not restarted by a liveness probe for it.
    `before_metrics()` brings gauges read on demand up to date before each /metrics page."""

    async def healthz(_: web.Request) -> web.Response:
        problem = await healthy()
        if problem is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"unhealthy: {problem}\n")

    async def livez(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics_page(_: web.Request) -> web.Response:
        if before_metrics is not None:
            await before_metrics()
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", metrics_page)
    # aiohttp's keep-alive timer runs from the connection's start, so it also closes one that
    # never completes a request (silent, or trickling its headers).
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=IDLE_SECONDS)
    await runner.setup()
    assert runner.server is not None
    connections = CappedProtocols(runner.server, HTTP_MAX_CONNECTIONS)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(connections, host, port)
    bound = server.sockets[0].getsockname()[1]
    return HttpServer(server, runner, connections, exhaustion.install(loop)), int(bound)
