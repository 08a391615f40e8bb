"""Per-sandbox usage in the gateway: what `read` answers for each kind of sandbox and driver, which
sandboxes the gauges list (`ranked`), and that a scrape flood reads each sandbox once per interval."""

from __future__ import annotations

import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxRecord, SandboxStatus
from warmshell.core.states import Phase
from warmshell.drivers.base import ComputeDriver, CreateRequest, SandboxUsage
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway import metrics, usage
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.store.sqlite import open_sqlite_store


def record(name: str, phase: Phase = Phase.READY) -> SandboxRecord:
    return SandboxRecord(id=SandboxId(f"sb-{name}"), name=name, status=SandboxStatus(phase=phase))


async def running(driver: FakeDriver, sandbox: SandboxRecord) -> None:
    await driver.create(CreateRequest(sandbox.id, sandbox.name, sandbox.workspace, sandbox.spec, "proof"))


async def test_read_asks_the_driver_of_a_running_sandbox() -> None:
    driver, sandbox = FakeDriver(), record("a")
    await running(driver, sandbox)
    driver.usages[sandbox.id] = SandboxUsage(cpu_seconds=2.0, workspace_bytes=4096)
    assert await usage.read(driver, sandbox) == SandboxUsage(cpu_seconds=2.0, workspace_bytes=4096)


async def test_read_says_why_a_usage_is_unknown() -> None:
    driver = FakeDriver()
    ended = await usage.read(driver, record("a", Phase.EXITED))
    assert ended == SandboxUsage(unknown="the sandbox is Exited, not running")
    elsewhere = await usage.read(driver, record("b"))  # Ready, but not this driver's
    assert elsewhere.unknown == "sandbox sb-b is not running"
    kubernetes: ComputeDriver = types.SimpleNamespace(name="kubernetes")  # type: ignore[assignment]
    unsupported = await usage.read(kubernetes, record("c"))
    assert unsupported == SandboxUsage(unknown="the kubernetes driver does not report usage")


usages = st.lists(st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)), max_size=30)


@given(cpus=usages, limit=st.integers(min_value=0, max_value=40))
def test_ranked_keeps_the_busiest_up_to_the_limit(cpus: list[float | None], limit: int) -> None:
    pairs = [(record(f"s{i}"), SandboxUsage(cpu_seconds=cpu)) for i, cpu in enumerate(cpus)]
    shown, unlisted = usage.ranked(pairs, limit)
    assert len(shown) == min(limit, len(pairs))
    assert unlisted == len(pairs) - len(shown)
    left_out = [u for r, u in pairs if all(r is not s for s, _ in shown)]
    least = min((u.cpu_seconds or 0.0 for _, u in shown), default=float("inf"))
    assert all((u.cpu_seconds or 0.0) <= least for u in left_out)


@pytest.fixture
async def records(tmp_path: Path) -> AsyncIterator[SandboxRecords]:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    try:
        yield SandboxRecords(store, EventBus(), exclusive=True)
    finally:
        await store.aclose()


class CountingDriver(FakeDriver):
    """The fake driver, counting the usage reads that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def usage(self, sandbox_id: SandboxId) -> SandboxUsage:
        self.reads += 1
        return await super().usage(sandbox_id)


def series(name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(f"warmshell_sandbox_{name}", {"workspace": "default", "name": "busy"})


async def test_the_gauges_list_the_top_sandboxes_once_per_interval(records: SandboxRecords) -> None:
    driver, now = CountingDriver(), [100.0]
    for name, cpu in (("busy", 9.0), ("idle", 0.1), ("ended", 50.0)):
        sandbox = record(name, Phase.EXITED if name == "ended" else Phase.READY)
        await records.insert(sandbox)
        await running(driver, sandbox)
        driver.usages[sandbox.id] = SandboxUsage(cpu_seconds=cpu, memory_bytes=1 << 20)
    gauges = usage.UsageGauges(driver, records, limit=1, min_interval=10.0, clock=lambda: now[0])
    await gauges.refresh()
    assert series("cpu_seconds") == 9.0
    assert series("memory_bytes") == float(1 << 20)
    assert series("workspace_bytes") is None  # unknown: no series, rather than a 0
    assert metrics.REGISTRY.get_sample_value("warmshell_sandbox_usage_unlisted") == 1.0
    assert driver.reads == 2  # the two running ones; the Exited one is not asked about
    for _ in range(5):  # a scrape flood within the interval
        await gauges.refresh()
    assert driver.reads == 2
    now[0] += 10.0
    await records.remove(SandboxId("sb-busy"))
    await gauges.refresh()
    assert driver.reads == 3
    assert series("cpu_seconds") is None  # gone with its sandbox
    assert metrics.REGISTRY.get_sample_value("warmshell_sandbox_usage_unlisted") == 0.0


async def test_a_limit_of_zero_reads_nothing(records: SandboxRecords) -> None:
    driver = CountingDriver()
    sandbox = record("busy")
    await records.insert(sandbox)
    await running(driver, sandbox)
    await usage.UsageGauges(driver, records, limit=0, min_interval=0).refresh()
    assert driver.reads == 0
