"""The local driver on this host's real cgroups (v1 here, writable by root; v2 where delegated):
a sandbox's processes are in its group before its workload runs, the group goes with the
sandbox, and what a crashed gateway left is swept at the next start, without touching another
gateway's groups."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.drivers_local.support import DriverFactory, driver_pids, needs_bwrap
from warmshell.core.config import LocalDriverConfig
from warmshell.core.ids import new_sandbox_id
from warmshell.core.models import Resources, SandboxSpec
from warmshell.drivers.base import CreateRequest
from warmshell.drivers.local.runtime import cgroups, cgroupsetup

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are root's on a cgroup v1 host")]


@pytest.fixture
def backend() -> Iterator[cgroups.Backend]:
    """This host's cgroups, under a parent of this test's own (a gateway of its own)."""
    found = cgroupsetup.choose(gateway=f"gw-test-{uuid.uuid4().hex[:8]}")
    assert not isinstance(found, cgroups.Unavailable), found.message
    yield found
    found.sweep()
    found.close()


def request(spec: SandboxSpec) -> CreateRequest:
    return CreateRequest(
        sandbox_id=new_sandbox_id(),
        name="bounded",
        workspace="default",
        spec=spec,
        activation_proof="proof-" + "x" * 40,
    )


def in_group(group: cgroups.Group, pid: int) -> bool:
    return all(str(pid) in procs.read_text().split() for procs in group.procs_files)


async def test_the_sandbox_runs_in_its_group_which_goes_with_it(
    make_driver: DriverFactory, backend: cgroups.Backend
) -> None:
    async with make_driver(config=LocalDriverConfig(), cgroup=backend) as driver:
        spec = SandboxSpec(resources=Resources(memory="128Mi", cpu="250m", pids=32))
        created = await driver.create(request(spec))
        (condition,) = [c for c in created.conditions if c.type == "ResourceLimits"]
        assert (condition.status, condition.reason) == ("True", "Enforced"), condition.message
        assert f"memory 128Mi ({backend.version})" in condition.message
        assert f"32 processes ({backend.version})" in condition.message
        group = driver._sandboxes[created.sandbox_id].cgroup
        assert group is not None
        (pid,) = driver_pids(driver)
        assert in_group(group, pid)  # bwrap itself: everything it starts is in the group too
        usage = await driver.usage(created.sandbox_id)
        assert usage.processes is not None
        assert usage.processes >= 2  # bwrap, the agent, the stand-in's shell
        await driver.delete(created.sandbox_id)
        assert not any(directory.exists() for directory in group.directories)


async def test_a_crashed_gateways_groups_are_swept_and_no_one_elses(
    make_driver: DriverFactory, backend: cgroups.Backend
) -> None:
    # What a gateway killed with -9 leaves: its sandboxes' groups, something still running in
    # one (a process that escaped its sandbox's end). Another gateway's group runs on.
    other = cgroupsetup.choose(gateway=f"gw-test-{uuid.uuid4().hex[:8]}")
    assert not isinstance(other, cgroups.Unavailable)
    left = backend.create("li-left-behind", cgroups.Limits(pids=8))
    theirs = other.create("li-theirs", cgroups.Limits(pids=8))
    survivor = subprocess.Popen(["sleep", "600"])
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        for procs in left.procs_files:
            procs.write_text(f"{survivor.pid}\n")
        for procs in theirs.procs_files:
            procs.write_text(f"{bystander.pid}\n")
        async with make_driver(config=LocalDriverConfig(), cgroup=backend):
            assert survivor.wait(timeout=5) == -9
            assert not any(directory.exists() for directory in left.directories)
            assert bystander.poll() is None
            assert in_group(theirs, bystander.pid)
    finally:
        other.remove(theirs)  # which kills what runs in it
        other.close()
        survivor.kill()
        assert bystander.wait(timeout=5) == -9
        survivor.wait()
    assert not any(directory.exists() for directory in theirs.directories)


def test_the_gateways_parent_goes_when_it_closes(backend: cgroups.Backend) -> None:
    group = backend.create("li-1", cgroups.Limits())
    parents = {directory.parent for directory in group.directories}
    backend.remove(group)
    backend.close()
    assert not any(Path(parent).exists() for parent in parents)
