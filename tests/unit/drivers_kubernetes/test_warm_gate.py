"""Claim allocation follows the driver's one extensions gate: off (one warning, creates cold as
NotReady) while the extension APIs are absent, on by itself when they appear, off again when a
call or a watch gets 404 on their collections — without a restart, and without leaking tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from warmshell.core.config import StatePaths
from warmshell.core.ids import SandboxId
from warmshell.drivers.base import MissReason
from warmshell.drivers.kubernetes import KubernetesDriver, kube
from warmshell.drivers.kubernetes.warm import extensions

from .fakes import config
from .test_claim_create import REQUEST, NoActivator
from .test_profiles_reconciler import FakeApi

Obj = dict[str, Any]


class Cluster(FakeApi):
    """The reconciler tests' in-memory API, whose extension APIs can come and go: removing them
    ends the watches on their collections, and a watch started while they are absent gets 404,
    as from an API server whose CRDs were deleted."""

    def __init__(self, *, extensions: bool = True) -> None:
        super().__init__()
        self.extensions = extensions
        self._flipped = asyncio.Event()
        self.probe_failures: list[kube.ApiError] = []  # raised by the next probes
        self.probes = 0
        self.missing: set[str] = set()  # plurals not served even while the group is

    def set_extensions(self, served: bool) -> None:
        self.extensions = served
        self._flipped.set()
        self._flipped = asyncio.Event()

    async def sandbox_resource(self, namespace: str) -> kube.Resource:
        return kube.sandboxes("v1beta1")

    async def list(self, resource: kube.Resource, namespace: str, *, label_selector: str = "", limit: int = 0) -> Obj:
        if resource == kube.SANDBOX_WARM_POOLS and limit == 1:
            self.probes += 1
            if self.probe_failures:
                raise self.probe_failures.pop(0)
        if resource.plural in self.missing:
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")
        return await super().list(resource, namespace, label_selector=label_selector, limit=limit)

    async def replace(self, resource: kube.Resource, namespace: str, name: str, body: Obj) -> Obj:
        return self.put(resource, body)

    async def watch(
        self, resource: kube.Resource, namespace: str, *, resource_version: str, label_selector: str = ""
    ) -> AsyncGenerator[Obj, None]:
        while True:
            self._absent(resource)
            await self._flipped.wait()
        yield {}  # an async generator that never yields: nothing happens on this watch


@pytest.fixture(autouse=True)
def _quick_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extensions, "PROBE_DELAYS", (0.01,))


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.INFO)

    def about_extensions() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.WARNING and kube.EXTENSIONS_GROUP in r.getMessage()
        ]

    return about_extensions


@pytest.fixture
async def cluster() -> Cluster:
    return Cluster(extensions=False)


@contextlib.asynccontextmanager
async def running(cluster: Cluster, tmp_path: Path, **settings: Any) -> AsyncIterator[KubernetesDriver]:
    driver = KubernetesDriver(config(**settings), StatePaths(tmp_path), api=cluster)  # type: ignore[arg-type]
    async with driver:
        await driver.start(NoActivator())
        subscription = driver.watch()
        try:
            yield driver
        finally:
            await subscription.aclose()


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the driver's tasks run (probes every 10 ms here) until `condition` holds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def allocating(driver: KubernetesDriver) -> bool:
    """The gate is on and everything that reads the extension APIs runs."""
    warm = driver.warm_allocation
    return (
        driver.warm_allocation_on
        and warm is not None
        and warm.running
        and warm.following_claims
        and warm.pool_cache.synced
    )


def claims_off(driver: KubernetesDriver) -> bool:
    warm = driver.warm_allocation
    return warm is not None and not warm.running and not warm.following_claims


async def test_absent_at_start_then_installed_turns_warm_pooling_on(
    cluster: Cluster, tmp_path: Path, warnings: Callable[[], list[str]]
) -> None:
    async with running(cluster, tmp_path) as driver:
        assert not driver.warm_allocation_on
        view = await driver.create(REQUEST)
        assert (view.allocation, view.miss_reason) == ("cold", MissReason.NOT_READY)
        assert driver.pools() == []
        assert claims_off(driver)
        await until(lambda: cluster.probes >= 5)
        assert len(warnings()) == 1

        cluster.set_extensions(True)
        await until(lambda: allocating(driver))
        assert len(warnings()) == 1


async def test_a_404_turns_it_off_once_and_a_probe_turns_it_on_again(
    cluster: Cluster, tmp_path: Path, warnings: Callable[[], list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    cluster.set_extensions(True)
    async with running(cluster, tmp_path) as driver:
        await until(lambda: allocating(driver))
        assert warnings() == []

        # The CRDs go: every claim-reading part sees 404 (get, the watches) — one warning.
        cluster.set_extensions(False)
        assert await driver.get(SandboxId("sbx-gone")) is None
        await until(lambda: claims_off(driver))
        assert not driver.warm_allocation_on
        assert driver.pools() == []
        assert await driver.list() == []
        assert not await driver.delete(SandboxId("sbx-gone"))
        probes = cluster.probes
        await until(lambda: cluster.probes >= probes + 5)
        assert len(warnings()) == 1

        cluster.set_extensions(True)
        await until(lambda: allocating(driver))
        assert len(warnings()) == 1
        assert any("warm pooling is on" in r.getMessage() for r in caplog.records)


async def test_an_api_that_cannot_answer_at_start_does_not_turn_warm_pooling_off(
    tmp_path: Path, warnings: Callable[[], list[str]]
) -> None:
    cluster = Cluster()
    cluster.probe_failures = [kube.Temporary(503, "ServiceUnavailable", "try later")]
    async with running(cluster, tmp_path) as driver:
        assert driver.warm_allocation is not None
        assert driver.warm_allocation.gate.available is None
        assert driver.warm_allocation_on  # unknown is not off: claims are still read
        await until(lambda: allocating(driver))
    assert not any("not installed" in w for w in warnings())


async def test_profiles_wait_on_the_drivers_gate_so_the_gateway_warns_once(
    cluster: Cluster, tmp_path: Path, warnings: Callable[[], list[str]]
) -> None:
    profiles = {"warm_pooling": {"profiles": {"enabled": True}}}
    async with running(cluster, tmp_path, **profiles) as driver:
        await until(lambda: cluster.items(kube.LEASES) != [])  # elected: the reconciler waits on the gate
        await until(lambda: cluster.probes >= 5)
        assert len(warnings()) == 1
        cluster.set_extensions(True)
        await until(lambda: allocating(driver))
        assert len(warnings()) == 1


async def test_a_half_installed_group_is_absent(cluster: Cluster) -> None:
    """Pools without claims would turn on, get 404 on the claims and turn off again, forever."""
    cluster.set_extensions(True)
    cluster.missing = {kube.SANDBOX_CLAIMS.plural}
    gate = extensions.ExtensionsGate(cluster, "warmshell")
    assert not await gate.probe()
    cluster.missing = set()
    assert await gate.probe()
