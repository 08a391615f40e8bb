"""A gateway's start and stop as one stack: a stop unwinds what started, last first (new calls
refused and sessions ended, then the loops, the servers' grace, the driver, the store, and the
HTTP endpoint last, saying "stopping" until then); a start that fails half-way releases what it
had opened. A whole gateway on real sockets with the fake driver, whose exit observes the rest."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.core.config import load_config
from warmshell.drivers.base import Activator
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.server import Gateway
from warmshell.gateway.store.sqlite import SqliteStore


class ObservedDriver(FakeDriver):
    """Notes what the rest of the gateway looks like when the gateway exits it."""

    def __init__(self, *, fail_start: bool = False) -> None:
        super().__init__()
        self.gateway: Gateway | None = None
        self.fail_start = fail_start
        self.seen_at_exit: dict[str, object] = {}

    async def start(self, activator: Activator) -> None:
        if self.fail_start:
            raise RuntimeError("the backend refused")
        await super().start(activator)

    async def __aexit__(self, *exc_info: object) -> None:
        gateway = self.gateway
        assert gateway is not None
        self.seen_at_exit = {
            "healthz": await _healthz(gateway.http_port),
            "loops": gateway.background,
            "pending registrations": gateway.parts.registry.pending_count(),
            "sockets": [p.exists() for p in (gateway.paths.socket, gateway.paths.supervisor_socket)],
            "store": await gateway.parts.store.ping(),
        }
        await super().__aexit__(*exc_info)


async def _healthz(port: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as response:
        return response.status, await response.text()


def _accepting(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
async def state() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ws-life-") as tmp:  # short: AF_UNIX paths
        yield Path(tmp) / "state"


@pytest.fixture
def closed_stores(monkeypatch: pytest.MonkeyPatch) -> list[SqliteStore]:
    """The SQLite stores closed from now on, in order (a spy on `aclose`)."""
    closed: list[SqliteStore] = []
    aclose = SqliteStore.aclose

    async def spied(store: SqliteStore) -> None:
        closed.append(store)
        await aclose(store)

    monkeypatch.setattr(SqliteStore, "aclose", spied)
    return closed


def _gateway(state: Path, driver: FakeDriver) -> Gateway:
    gateway = Gateway(load_config(None, {"state_dir": str(state), "http_port": 0}), driver)
    if isinstance(driver, ObservedDriver):
        driver.gateway = gateway
    return gateway


async def test_a_stop_unwinds_what_started_last_first(state: Path, closed_stores: list[SqliteStore]) -> None:
    driver = ObservedDriver()
    gateway = _gateway(state, driver)
    await gateway.start()
    assert await _healthz(gateway.http_port) == (200, "ok\n")
    assert len(gateway.background) == 3
    assert not any(task.done() for task in gateway.background)
    channel = grpc.aio.insecure_channel(f"unix://{gateway.paths.supervisor_socket}")
    stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
    registering = stub.RegisterSupervisor(
        spb.RegisterSupervisorRequest(bootstrap_credential=driver.add_warm_instance())
    )
    async with asyncio.timeout(10):
        while gateway.parts.registry.pending_count() == 0:
            await asyncio.sleep(0.01)
    http_port = gateway.http_port
    try:
        await gateway.stop()
        # The driver exits after the calls, the sessions, the loops and the sockets are gone, on
        # a store still open and with /healthz still saying why the gateway does not serve.
        assert driver.seen_at_exit == {
            "healthz": (503, "unhealthy: not serving: stopping\n"),
            "loops": (),
            "pending registrations": 0,
            "sockets": [False, False],
            "store": None,
        }
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await registering.read()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert closed_stores == [gateway.parts.store]
        assert not _accepting(http_port), "the HTTP endpoint stops last, and stops"
        assert not gateway.paths.runtime_info.exists()
        await gateway.stop()  # a second stop has nothing left to do
        assert closed_stores == [gateway.parts.store]
    finally:
        await channel.close(grace=None)


async def test_a_start_that_fails_half_way_releases_what_it_had_opened(
    state: Path, closed_stores: list[SqliteStore]
) -> None:
    driver = ObservedDriver(fail_start=True)
    gateway = _gateway(state, driver)
    with pytest.raises(RuntimeError, match="the backend refused"):
        await gateway.start()
    assert driver.seen_at_exit["sockets"] == [False, False], "the sockets were gone before the driver exited"
    assert closed_stores == [gateway.parts.store]
    assert not _accepting(gateway.http_port)
    assert not gateway.paths.socket.exists()
    assert not gateway.paths.runtime_info.exists()
    # Nothing of the failed start is left to stop; the state dir serves a new start.
    await gateway.stop()
    again = _gateway(state, FakeDriver())
    await again.start()
    await again.stop()
