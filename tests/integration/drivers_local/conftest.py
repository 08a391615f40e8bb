"""Fixtures for driver-level tests of the local driver with real bwrap processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.drivers_local.support import STAND_IN, DriverFactory, driver_pids, stand_in
from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.drivers.local import LocalDriver
from warmshell.drivers.local.runtime import cgroups


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    state = StatePaths(tmp_path / "state")
    state.root.mkdir()
    return state


@pytest.fixture
async def make_driver(paths: StatePaths) -> AsyncIterator[DriverFactory]:
    """Build drivers (default: the stand-in supervisor running `STAND_IN`, no cgroup v2, a
    host-directory workspace); all
    closed at the end and every process they spawned checked gone."""
    made: list[LocalDriver] = []

    def factory(
        script: str | None = None,
        config: LocalDriverConfig | None = None,
        cgroup: cgroups.CgroupV2 | cgroups.Unavailable | None = None,
        state: StatePaths | None = None,
    ) -> LocalDriver:
        driver = LocalDriver(
            # These tests talk to a sandbox through its workspace directory on the host (`workspace_of`),
            # so by default /workspace is that directory rather than the sandbox's own tmpfs.
            config or LocalDriverConfig(workspace_size=""),
            state or paths,
            supervise=stand_in(state or paths, script or STAND_IN),  # type: ignore[arg-type]
            cgroup=cgroup or cgroups.Unavailable("test host: no cgroup v2"),
            kill_grace_seconds=0.5,
        )
        made.append(driver)
        return driver

    yield factory
    for driver in made:
        pids = driver_pids(driver)
        await driver.aclose()
        for pid in pids:
            assert not Path(f"/proc/{pid}").exists(), f"process {pid} left behind"
