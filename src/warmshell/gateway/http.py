"""The small HTTP side of the gateway: /healthz (readiness: can it serve?), /livez (liveness: is
the process answering at all?) and /metrics (Prometheus text format)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from warmshell.gateway import metrics

__all__ = ["start_http"]


async def start_http(host: str, port: int, healthy: Callable[[], Awaitable[str | None]]) -> tuple[web.AppRunner, int]:
    """Serve health and metrics; returns the runner (for cleanup) and the bound port.

    `healthy()` returns None when all is well, else the reason it is not. `/livez` is always 200
    while the process answers: it does not depend on the store, so a gateway waiting for its
    database (NotServing on `/healthz`) is not restarted by a liveness probe for it."""

    async def healthz(_: web.Request) -> web.Response:
        problem = await healthy()
        if problem is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"unhealthy: {problem}\n")

    async def livez(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics_page(_: web.Request) -> web.Response:
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", metrics_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
