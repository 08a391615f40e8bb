"""Per-sandbox usage: what `GetSandbox` adds to one sandbox, and the per-sandbox Prometheus gauges.

Both ask the driver (`drivers.base.UsageReporter`) when they need it, never on a timer of their
own: a gateway nobody asks about usage reads nothing. A driver that reports no usage (the
Kubernetes one: its sandboxes' cgroups are the kubelet's, read by cAdvisor and metrics-server)
gives every sandbox an unknown usage that says so.

The gauges carry a sandbox's workspace and name as labels, so each sandbox is a series of its
own, and a series stays in Prometheus's memory for hours after the sandbox is gone. Names are
new on every create: a gateway churning 1,000 sandboxes an hour would add 6,000 series an hour
with every sandbox listed. Only the `metrics.per_sandbox_limit` sandboxes that have used the most
cpu are listed (the ones an operator looks for; ranked by cpu seconds so far, which changes order
slowly, so the listed set does not churn on every scrape); how many were left out is a gauge of
its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from warmshell.core.config import MetricsConfig
from warmshell.core.errors import FailedPreconditionError
from warmshell.core.models import SandboxRecord
from warmshell.core.states import Phase
from warmshell.drivers.base import ComputeDriver, SandboxUsage, UsageReporter
from warmshell.gateway import metrics
from warmshell.gateway.records import SandboxRecords

__all__ = ["UsageGauges", "ranked", "read"]


async def read(driver: ComputeDriver, record: SandboxRecord) -> SandboxUsage:
    """The sandbox's usage now, as its driver reads it; unknown (saying why) when it is not
    running here or the driver reports none."""
    if record.status.phase != Phase.READY:
        return SandboxUsage(unknown=f"the sandbox is {record.status.phase.value}, not running")
    if not isinstance(driver, UsageReporter):
        return SandboxUsage(unknown=f"the {driver.name} driver does not report usage")
    try:
        return await driver.usage(record.id)
    except FailedPreconditionError as exc:
        return SandboxUsage(unknown=str(exc))


def ranked(
    usages: Sequence[tuple[SandboxRecord, SandboxUsage]], limit: int
) -> tuple[list[tuple[SandboxRecord, SandboxUsage]], int]:
    """The `limit` sandboxes that used the most cpu (unknown counts as none; ties by name, so the
    order is stable), and how many were left out."""
    ordered = sorted(usages, key=lambda pair: (-(pair[1].cpu_seconds or 0.0), pair[0].workspace, pair[0].name))
    return ordered[:limit], max(0, len(ordered) - limit)


class UsageGauges:
    """The per-sandbox gauges, refreshed when scraped, at most once every `min_interval` seconds
    (a scraper hammering /metrics costs one read of each sandbox per interval, no more)."""

    def __init__(
        self,
        driver: ComputeDriver,
        records: SandboxRecords,
        *,
        limit: int,
        min_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._driver = driver
        self._records = records
        self._limit = limit
        self._min_interval = min_interval
        self._clock = clock
        self._last: float | None = None

    @classmethod
    def for_config(cls, config: MetricsConfig, driver: ComputeDriver, records: SandboxRecords) -> UsageGauges:
        """The gauges as the gateway's `[metrics]` section sets them."""
        return cls(driver, records, limit=config.per_sandbox_limit, min_interval=config.per_sandbox_refresh_seconds)

    async def refresh(self) -> None:
        """Read every running sandbox's usage and publish the top `limit` (no-op when disabled,
        when the driver reports no usage, or when the last refresh is recent)."""
        if self._limit == 0 or not isinstance(self._driver, UsageReporter):
            return
        now = self._clock()
        if self._last is not None and now - self._last < self._min_interval:
            return
        self._last = now
        running = [r for r in await self._records.list(None) if r.status.phase == Phase.READY]
        usages = await asyncio.gather(*(read(self._driver, r) for r in running))
        # A sandbox whose driver knows nothing of it (another replica's) is not this gateway's to list.
        known = [
            (r, u) for r, u in zip(running, usages, strict=True) if any(v is not None for v in u.figures().values())
        ]
        shown, unlisted = ranked(known, self._limit)
        publish(shown, unlisted)


def publish(shown: Sequence[tuple[SandboxRecord, SandboxUsage]], unlisted: int) -> None:
    """Replace the per-sandbox series with `shown`'s (a figure that is unknown has no series)."""
    for gauge in metrics.SANDBOX_USAGE.values():
        gauge.clear()
    for record, usage in shown:
        for figure, value in usage.figures().items():
            if value is not None:
                metrics.SANDBOX_USAGE[figure].labels(workspace=record.workspace, name=record.name).set(value)
    metrics.SANDBOX_USAGE_UNLISTED.set(unlisted)
