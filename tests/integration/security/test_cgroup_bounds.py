"""Memory, cpu and the freezer through the sandbox's cgroups, on this very host (cgroup v1 with
its controllers writable by root; a delegated v2 would do as well): a memory balloon and a tmpfs
inode flood end inside their sandbox, a cpu-bound loop gets its share and no more, a frozen
sandbox stops and a thawed one goes on. The gateway and a bystander sandbox are unaffected."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import py, sandbox, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.ids import SandboxId
from warmshell.drivers.local import LocalDriver
from warmshell.drivers.local.runtime import cgroups

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are writable by root only on a cgroup v1 host"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr"),
]

SIGKILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # how an exec may report a SIGKILL


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state") as running:
        await sandbox(running, "bystander")
        yield running


def driver_of(gw: RunningGateway) -> LocalDriver:
    driver = gw.gateway.parts.driver
    assert isinstance(driver, LocalDriver)
    return driver


async def bounded(gw: RunningGateway, name: str, resources: pb.Resources) -> SandboxId:
    """Create `name` with these resources; check its condition says the cgroup enforces them."""
    ready = await sandbox(gw, name, pb.SandboxSpec(resources=resources))
    limits = next(c for c in ready.status.conditions if c.type == "ResourceLimits")
    enforced = limits.message.split(". Not enforced")[0].split("; ")
    for name in ("memory", "cpu"):
        if getattr(resources, name):
            assert any(part.startswith(f"{name} ") and "(cgroup v" in part for part in enforced), limits.message
    return SandboxId(ready.id)


def group_of(gw: RunningGateway, sandbox_id: SandboxId) -> cgroups.Group:
    """The sandbox's cgroup (test introspection)."""
    group = driver_of(gw)._sandboxes[sandbox_id].cgroup
    assert group is not None
    return group


async def test_a_memory_balloon_is_oom_killed_inside_its_sandbox(gw: RunningGateway) -> None:
    sandbox_id = await bounded(gw, "balloon", pb.Resources(memory="64Mi"))
    # 256 MiB, every page written: four times the limit.
    code, out, _ = await py(gw, "balloon", "b = b'x' * (256 << 20)\nprint('survived', len(b))")
    assert code in SIGKILLED, (code, out)  # reported as the kill it was, not as a success
    assert out == ""
    usage = await driver_of(gw).usage(sandbox_id)
    assert usage.memory_peak_bytes is not None
    assert usage.memory_peak_bytes <= 64 * 2**20
    await still_real(gw, "balloon")  # only the balloon died: its sandbox goes on
    await still_real(gw, "bystander")


async def test_a_cpu_bound_loop_gets_at_most_its_share(gw: RunningGateway) -> None:
    sandbox_id = await bounded(gw, "spinner", pb.Resources(cpu="500m"))
    spin = "import time\nend = time.monotonic() + 6\nwhile time.monotonic() < end: pass"
    spinning = asyncio.create_task(py(gw, "spinner", spin))
    driver = driver_of(gw)
    try:
        await asyncio.sleep(1)  # past the start of python
        before, start = await driver.usage(sandbox_id), time.monotonic()
        await asyncio.sleep(2)
        after, end = await driver.usage(sandbox_id), time.monotonic()
    finally:
        assert (await spinning)[0] == 0
    assert before.cpu_seconds is not None
    assert after.cpu_seconds is not None
    share = (after.cpu_seconds - before.cpu_seconds) / (end - start)
    # At most half a core (and a little for the period's granularity); something, on a busy host.
    assert 0.05 < share <= 0.55, share
    await still_real(gw, "bystander")


async def test_a_tmpfs_inode_flood_is_stopped_by_the_sandboxs_memory_limit(gw: RunningGateway) -> None:
    # 300,000 empty files take no tmpfs blocks (so /tmp's size does not stop them) but some
    # 300 MB of kernel memory (inodes, dentries), which the memory cgroup charges to the sandbox.
    sandbox_id = await bounded(gw, "flood", pb.Resources(memory="64Mi"))
    group = group_of(gw, sandbox_id)
    flood = "for i in range(300000):\n    open(f'/tmp/f{i}', 'w').close()\nprint('made them all')"
    code, out, _ = await py(gw, "flood", flood)
    assert code != 0
    assert "made them all" not in out
    usage = await driver_of(gw).usage(sandbox_id)
    assert usage.memory_bytes is not None
    assert usage.memory_bytes <= 64 * 2**20
    await still_real(gw, "bystander")
    await gw.delete("flood")  # and its cgroup (with the kernel memory charged to it) goes too
    assert not any(directory.exists() for directory in group.directories)


def counter(pid: int) -> int:
    """The count the sandbox's loop last wrote, read through its root from the host."""
    text = Path(f"/proc/{pid}/root/tmp/count").read_text().strip()
    return int(text) if text else 0


async def test_a_frozen_sandbox_stops_and_a_thawed_one_goes_on(gw: RunningGateway) -> None:
    sandbox_id = await bounded(gw, "sleeper", pb.Resources())
    loop = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done"
    counting = asyncio.create_task(gw.exec("sleeper", ["/bin/sh", "-c", loop], timeout_seconds=30))
    pids = [int(p) for p in group_of(gw, sandbox_id).procs_files[0].read_text().split()]
    # The sandbox's /tmp, seen through the root of one of its processes (bwrap's outermost
    # process stays in the host's user namespace, and in its launch's mount namespace).
    inside = [pid for pid in pids if os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")]
    while not Path(f"/proc/{inside[0]}/root/tmp/count").exists():
        await asyncio.sleep(0.05)
    pid = inside[0]
    driver = driver_of(gw)
    try:
        await driver.freeze(sandbox_id)
        frozen = counter(pid)
        await asyncio.sleep(0.5)
        assert counter(pid) == frozen  # nothing of it ran
        states = {Path(f"/proc/{p}/status").read_text().split("State:")[1].split()[0] for p in pids}
        assert states <= {"D", "T"}, states  # frozen: D under the v1 freezer, T under v2's
        await driver.freeze(sandbox_id, frozen=False)
        await asyncio.sleep(0.5)
        assert counter(pid) > frozen + 5
    finally:
        await driver.freeze(sandbox_id, frozen=False)
        counting.cancel()
        await asyncio.gather(counting, return_exceptions=True)
    await still_real(gw, "sleeper")
    await still_real(gw, "bystander")
