"""Attacks on a sandbox's default bounds from inside it (real gateway, real bwrap'd sandboxes):
filling /workspace, /tmp, /run, /dev/shm and /dev, a file past the size limit, a fork bomb; each
is stopped inside the sandbox while the gateway and a bystander carry on, and a delete gives the
space back. And requests for absurd or excessive resources are refused naming the field."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb

BOUNDS = {
    "local.workspace_size": "16Mi",
    "local.tmp_size": "8Mi",
    "local.run_size": "2Mi",
    "local.shm_size": "4Mi",
    "local.max_file_size": "3Mi",
    "local.max_processes": 64,
}


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", **BOUNDS) as running:
        for name in ("hostile", "bystander"):
            await running.create(name=name)
        for name in ("hostile", "bystander"):
            assert (await running.wait_ready(name)).status.phase == pb.SANDBOX_PHASE_READY
        yield running


async def sh(gw: RunningGateway, script: str, name: str = "hostile") -> tuple[int, bytes, bytes]:
    return await gw.exec(name, ["/bin/sh", "-c", script])


async def bystander_fine(gw: RunningGateway) -> None:
    assert (await sh(gw, "echo fine", "bystander"))[:2] == (0, b"fine\n")


@pytest.mark.parametrize(("path", "size_mib"), [("/workspace", 16), ("/tmp", 8), ("/run", 2), ("/dev/shm", 4)])
async def test_filling_a_tmpfs_stops_at_its_size(gw: RunningGateway, path: str, size_mib: int) -> None:
    # Files of 1Mi each (under the file-size limit), until the tmpfs is full.
    script = f"i=0; while dd if=/dev/zero of={path}/f$i bs=1M count=1 2>/dev/null; do i=$((i+1)); done"
    assert (await sh(gw, script))[0] == 0
    code, out, _ = await sh(gw, f"df -Pk {path} | tail -1")
    assert code == 0
    total_kib, _, free_kib = (int(field) for field in out.split()[1:4])
    assert total_kib == size_mib * 1024
    assert free_kib < 1024
    code, _, err = await sh(gw, f"head -c 1048576 /dev/zero > {path}/more")
    assert code != 0
    assert b"No space left on device" in err
    await bystander_fine(gw)
    await gw.create(name="newcomer")
    assert (await gw.wait_ready("newcomer")).status.phase == pb.SANDBOX_PHASE_READY


def mount_namespaces_of(instance_id: str) -> set[int]:
    """The mount namespaces of the processes of one sandbox (found by the id bwrap sets in their
    environment)."""
    marker = f"WARMSHELL_INSTANCE_ID={instance_id}\0".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker in Path(entry.path, "environ").read_bytes():
                    found.add(os.stat(Path(entry.path, "ns", "mnt")).st_ino)
            except OSError:
                continue  # gone, or not ours to read
    return found


async def test_a_full_workspace_is_on_no_disk_and_delete_frees_it(gw: RunningGateway, tmp_path: Path) -> None:
    hostile = await gw.get("hostile")
    script = "i=0; while dd if=/dev/zero of=/workspace/f$i bs=1M count=1 2>/dev/null; do i=$((i+1)); done"
    assert (await sh(gw, script))[0] == 0
    # Nothing of it is on the host's disk: /workspace is the sandbox's own tmpfs.
    assert not list((tmp_path / "state").rglob("f0"))
    namespaces = mount_namespaces_of(hostile.status.instance_id)
    assert namespaces
    await gw.delete("hostile")
    # No process holds its mount namespace any more, so the kernel has freed the tmpfs.
    assert mount_namespaces_of(hostile.status.instance_id) == set()
    await bystander_fine(gw)


async def test_dev_is_read_only(gw: RunningGateway) -> None:
    code, _, err = await sh(gw, "echo x > /dev/fill")
    assert code != 0
    assert b"Read-only file system" in err
    assert (await sh(gw, "echo x > /dev/null && echo ok"))[:2] == (0, b"ok\n")


async def test_a_file_past_the_size_limit_is_refused(gw: RunningGateway) -> None:
    code, _, err = await sh(gw, "dd if=/dev/zero of=/workspace/big bs=1M count=4")
    assert code != 0
    # SIGXFSZ ends dd (the shell reports it), or a caller that ignores it sees EFBIG.
    assert b"File size limit exceeded" in err or b"File too large" in err
    code, out, _ = await sh(gw, "stat -c %s /workspace/big")
    assert int(out) == 3 * 2**20
    await bystander_fine(gw)


@pytest.mark.skipif(os.geteuid() != 0, reason="the process bound needs a uid per sandbox (a gateway run as root)")
async def test_a_fork_bomb_is_stopped_by_the_process_bound(gw: RunningGateway) -> None:
    script = "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; wait"
    _, _, err = await gw.exec("hostile", ["/bin/sh", "-c", script], timeout_seconds=5)
    assert b"fork" in err.lower() or b"resource temporarily unavailable" in err.lower()
    await bystander_fine(gw)
    ready = await gw.get("hostile")
    limits = next(c for c in ready.status.conditions if c.type == "ResourceLimits")
    assert "64 processes (rlimit)" in limits.message or "64 processes (cgroup v" in limits.message


async def test_the_condition_says_what_is_and_is_not_enforced(gw: RunningGateway) -> None:
    sandbox = await gw.get("bystander")
    limits = next(c for c in sandbox.status.conditions if c.type == "ResourceLimits")
    assert "/workspace 16Mi, /tmp 8Mi, /run 2Mi, /dev/shm 4Mi (tmpfs)" in limits.message
    assert "file size 3Mi (rlimit)" in limits.message
    assert "/workspace disk use" not in limits.message
    if limits.reason == "CgroupUnavailable":
        assert limits.status == "False"
        assert "Not enforced: memory 2Gi, cpu 1 (" in limits.message


@pytest.mark.skipif(os.geteuid() != 0, reason="the process bound needs a uid per sandbox (a gateway run as root)")
async def test_a_request_sets_its_own_process_bound(gw: RunningGateway) -> None:
    await gw.create(name="frugal", spec=pb.SandboxSpec(resources=pb.Resources(pids=24)))
    ready = await gw.wait_ready("frugal")
    assert ready.spec.resources.pids == 24
    limits = next(c for c in ready.status.conditions if c.type == "ResourceLimits")
    assert "24 processes (rlimit)" in limits.message or "24 processes (cgroup v" in limits.message
    script = "i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); done; wait"
    _, _, err = await gw.exec("frugal", ["/bin/sh", "-c", script], timeout_seconds=5)
    assert b"fork" in err.lower() or b"resource temporarily unavailable" in err.lower()
    # 40 fit under the default of 64.
    assert (
        await gw.exec(
            "bystander", ["/bin/sh", "-c", "i=0; while [ $i -lt 40 ]; do sleep 0.5 & i=$((i+1)); done; wait; echo ok"]
        )
    )[:2] == (0, b"ok\n")


@pytest.mark.parametrize(
    ("resources", "field", "rule"),
    [
        ({"memory": "1k"}, "spec.resources.memory", "less than 4Mi"),
        ({"memory": "1Ei"}, "spec.resources.memory", "more than 64Ti"),
        ({"cpu": "99999999999"}, "spec.resources.cpu", "more than 4096 cpus"),
        ({"cpu": "4000"}, "spec.resources.cpu", "more than this gateway allows"),
        ({"memory": "60Ti"}, "spec.resources.memory", "more than this gateway allows"),
        ({"pids": 5}, "spec.resources.pids", "must be between 16 and 4194304"),
        ({"pids": -1}, "spec.resources.pids", "must be between 16 and 4194304"),
        ({"pids": 40000}, "spec.resources.pids", "40000 is more than this gateway allows (32768)"),
    ],
)
async def test_absurd_or_excessive_requests_are_refused(
    gw: RunningGateway, resources: dict[str, str | int], field: str, rule: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gw.create(name="greedy", spec=pb.SandboxSpec(resources=pb.Resources(**resources)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (refused.value.details() or "")
    assert rule in (refused.value.details() or "")


async def test_a_pool_profile_sets_its_members_storage_and_process_bound(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    profile = 'version = 1\nworkspace = "default"\nreplicas = 1\n[resources]\npids = 48\n'
    (pools / "small.toml").write_text(profile + '[storage]\nworkspace = "12Mi"\ntmp = "6Mi"\n')
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "small")) is not None and p.idle >= 1)
        (pool,) = [p for p in (await gw.stub.ListPools(pb.ListPoolsRequest(), metadata=gw.metadata)).pools]
        assert pool.resources.pids == 48
        await gw.create(name="pooled", spec=pb.SandboxSpec(resources=pb.Resources(pids=48)))
        served = await gw.wait_ready("pooled")
        assert served.status.allocation == "warm"
        code, out, _ = await gw.exec("pooled", ["/bin/sh", "-c", "df -Pk /workspace /tmp | tail -2"])
        assert code == 0
        assert [int(line.split()[1]) for line in out.decode().splitlines()] == [12 * 1024, 6 * 1024]
        limits = next(c for c in served.status.conditions if c.type == "ResourceLimits")
        assert "/workspace 12Mi, /tmp 6Mi, /run 16Mi, /dev/shm 64Mi (tmpfs)" in limits.message
        # A request without a process count does not match the pool: cold, with the defaults.
        cold = await gw.create(name="plain")
        assert cold.status.allocation == "cold"
        await gw.wait_ready("plain")
        code, out, _ = await gw.exec("plain", ["/bin/sh", "-c", "df -Pk /workspace | tail -1"])
        assert int(out.split()[1]) == 1024 * 1024


async def test_a_profile_over_the_maximum_makes_no_pool(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "big.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\n[storage]\nworkspace = "8Gi"\n')
    settings = {"local.pools_dir": str(pools), "local.max_storage_size": "4Gi"}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        listed = await wait_pools(gw, lambda r: pool_named(r, "big") is not None)
        big = pool_named(listed, "big")
        assert big is not None
        assert any(
            "storage.workspace: '8Gi' is more than this gateway allows (4Gi)" in c.message for c in big.conditions
        )
        assert big.idle == 0
