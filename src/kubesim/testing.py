"""Start a kubesim API server inside a test or benchmark (no pytest dependency).

async with running_apiserver(kubeconfig=tmp_path / "kubeconfig") as server:
    ...  # server.url, server.user_token, server.faults, server.log
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from kubesim.apiserver import ApiServer, ServerConfig


@asynccontextmanager
async def running_apiserver(
    config: ServerConfig | None = None,
    *,
    kubeconfig: str | Path | None = None,
) -> AsyncIterator[ApiServer]:
    """Run an ``ApiServer`` on a free loopback port for the duration of the block."""
    server = ApiServer(config)
    await server.start()
    try:
        if kubeconfig is not None:
            server.write_kubeconfig(kubeconfig)
        yield server
    finally:
        await server.stop()
