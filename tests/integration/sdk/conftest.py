"""A real gateway process (local driver, the example warm pools, bwrap'd supervisors) shared by
a module's SDK tests; each test gets a client and leaves no sandbox behind."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.cli import CliGateway, start_gateway

REPO = Path(__file__).resolve().parents[3]
POOLS = REPO / "examples" / "pools"
# A maximum makes the lifetime rules observable; a short check interval makes expiry prompt.
CONFIG = """
[lifetimes]
default_ttl_seconds = 600
max_ttl_seconds = 3600
check_interval_seconds = 0.2
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    root = tmp_path_factory.mktemp("sdk")
    config = root / "gateway.toml"
    config.write_text(CONFIG)
    running = start_gateway(root / "state", "--config", str(config), "--pools", str(POOLS))
    try:
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


@pytest.fixture(params=["grpcio", "http2"])
def client(gateway: CliGateway, request: pytest.FixtureRequest) -> Iterator[warmshell.Client]:
    """A sync client on each transport: every sync test is also the two transports' conformance test."""
    with warmshell.Client(state_dir=gateway.state_dir, transport=request.param) as client:
        try:
            yield client
        finally:
            for info in client.list(all_workspaces=True):
                client.get(info.name, workspace=info.workspace).delete()


@pytest.fixture
async def aclient(gateway: CliGateway) -> AsyncIterator[warmshell.AsyncClient]:
    """An async client; like `client`, it leaves no sandbox behind."""
    async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
        try:
            yield client
        finally:
            for info in await client.list(all_workspaces=True):
                await (await client.get(info.name, workspace=info.workspace)).delete()


def wait_pool_idle(client: warmshell.Client, name: str, timeout: float = 30.0) -> warmshell.PoolInfo:
    """Poll the pools (they have no watch) until `name` has an idle member, or fail with the last view."""
    deadline = time.monotonic() + timeout
    while True:
        pools = {p.name: p for p in client.pools()}
        pool = pools.get(name)
        if pool is not None and pool.idle >= 1:
            return pool
        if time.monotonic() > deadline:
            raise AssertionError(f"pool {name} has no idle member after {timeout}s: {pools}")
        time.sleep(0.05)
