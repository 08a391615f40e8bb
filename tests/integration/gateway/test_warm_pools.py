"""Warm pools on the local driver, end to end with real bwrap'd supervisors: hits, misses by
shape, ambiguity, an empty pool, refill, profile change and removal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb


def write_profile(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text(body)
    tmp.replace(directory / f"{name}.toml")  # atomic: the reloader never reads half a file


def profile(replicas: int, env: str = "", cpu: str = "") -> str:
    text = f'version = 1\nworkspace = "default"\nreplicas = {replicas}\nimage = ""\n'
    if env:
        text += f"[environment]\n{env}\n"
    if cpu:
        text += f'[resources]\ncpu = "{cpu}"\n'
    return text


def idle(name: str, count: int):  # type: ignore[no-untyped-def]
    def check(response: pb.ListPoolsResponse) -> bool:
        found = pool_named(response, name)
        return found is not None and found.idle >= count

    return check


def reason_of(sandbox: pb.Sandbox) -> tuple[str, str]:
    allocated = next(c for c in sandbox.status.conditions if c.type == "Allocated")
    return allocated.reason, allocated.message


@pytest.fixture
def pools_dir(tmp_path: Path) -> Path:
    return tmp_path / "pools"


@pytest.fixture
async def gw(tmp_path: Path, pools_dir: Path) -> AsyncIterator[RunningGateway]:
    pools_dir.mkdir()
    async with running_gateway(
        tmp_path / "state", **{"local.pools_dir": str(pools_dir), "local.pool_reload_interval_seconds": 0.1}
    ) as running:
        yield running


async def test_matching_create_goes_warm_and_the_pool_refills(gw: RunningGateway, pools_dir: Path) -> None:
    write_profile(pools_dir, "foo", profile(2, env='FOO = "bar"'))
    pools = await wait_pools(gw, idle("foo", 2))
    foo = pool_named(pools, "foo")
    assert foo is not None
    created = await gw.create(
        name="w1",
        spec=pb.SandboxSpec(environment={"FOO": "bar"}, command=["sh", "-c", "echo $FOO; sleep 30"]),
        labels={"run": "1"},
    )
    ready = await gw.wait_ready("w1")
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    assert ready.status.allocation == "warm"
    assert ready.status.pool == foo.name
    assert created.status.allocation == "warm"
    assert reason_of(ready)[0] == "PoolHit"
    code, out, _ = await gw.exec("w1", ["sh", "-c", "echo $FOO; hostname"])
    assert (code, out) == (0, b"bar\nw1\n")
    # The used member never returns; the pool refills to its desired size.
    after = await wait_pools(gw, idle("foo", 2))
    refilled = pool_named(after, "foo")
    assert refilled is not None
    assert refilled.hits == 1
    assert refilled.desired == 2


async def test_other_shape_goes_cold_with_reason(gw: RunningGateway, pools_dir: Path) -> None:
    write_profile(pools_dir, "default", profile(1))
    await wait_pools(gw, idle("default", 1))
    await gw.create(name="c1", spec=pb.SandboxSpec(resources=pb.Resources(cpu="0.5")))
    ready = await gw.wait_ready("c1")
    assert ready.status.allocation == "cold"
    assert reason_of(ready) == ("PoolMiss", "NoMatch")
    misses = await gw.stub.ListPools(pb.ListPoolsRequest(), metadata=gw.metadata)
    assert misses.misses_by_reason["NoMatch"] >= 1


async def test_two_pools_with_one_shape_are_ambiguous(gw: RunningGateway, pools_dir: Path) -> None:
    write_profile(pools_dir, "a", profile(1, cpu="0.2"))
    write_profile(pools_dir, "b", profile(1, cpu="200m"))
    await wait_pools(gw, lambda r: all(pool_named(r, n) is not None for n in ("a", "b")))
    await gw.create(name="amb", spec=pb.SandboxSpec(resources=pb.Resources(cpu="0.2")))
    ready = await gw.wait_ready("amb")
    assert ready.status.allocation == "cold"
    assert reason_of(ready) == ("PoolMiss", "Ambiguous")


async def test_empty_pool_falls_back_to_cold(gw: RunningGateway, pools_dir: Path) -> None:
    write_profile(pools_dir, "one", profile(1, env='ONE = "1"'))
    await wait_pools(gw, idle("one", 1))
    spec = pb.SandboxSpec(environment={"ONE": "1"})
    # Sent together, so both are matched before the refill the first claim starts can register
    # (one after the other, a member start of a few ms could win the race on an idle machine).
    created = await asyncio.gather(gw.create(name="e1", spec=spec), gw.create(name="e2", spec=spec))
    by_allocation = {c.status.allocation: c.name for c in created}
    assert sorted(by_allocation) == ["cold", "warm"]
    assert reason_of(await gw.wait_ready(by_allocation["cold"])) == ("PoolMiss", "Empty")
    assert (await gw.wait_ready(by_allocation["warm"])).status.phase == pb.SANDBOX_PHASE_READY


async def test_profile_change_replaces_members_and_removal_drains(gw: RunningGateway, pools_dir: Path) -> None:
    write_profile(pools_dir, "chg", profile(2, env='V = "1"'))
    first = pool_named(await wait_pools(gw, idle("chg", 2)), "chg")
    assert first is not None
    write_profile(pools_dir, "chg", profile(2, env='V = "2"'))
    changed = await wait_pools(
        gw, lambda r: (p := pool_named(r, "chg")) is not None and p.fingerprint != first.fingerprint and p.idle == 2
    )
    assert dict(pool_named(changed, "chg").environment) == {"V": "2"}  # type: ignore[union-attr]
    await gw.create(name="v2", spec=pb.SandboxSpec(environment={"V": "2"}))
    assert (await gw.wait_ready("v2")).status.allocation == "warm"
    await gw.create(name="v1", spec=pb.SandboxSpec(environment={"V": "1"}))
    assert (await gw.wait_ready("v1")).status.allocation == "cold"
    (pools_dir / "chg.toml").unlink()
    await wait_pools(gw, lambda r: pool_named(r, "chg") is None)


async def test_invalid_profile_is_reported_and_others_keep_working(gw: RunningGateway, pools_dir: Path) -> None:
    write_profile(pools_dir, "good", profile(1, env='G = "1"'))
    write_profile(pools_dir, "bad", 'version = 2\nworkspace = "default"\nreplicas = 1\n')
    await wait_pools(gw, idle("good", 1))
    await gw.create(name="g", spec=pb.SandboxSpec(environment={"G": "1"}))
    assert (await gw.wait_ready("g")).status.allocation == "warm"
