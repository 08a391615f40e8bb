"""More idle members than one HTTP/2 connection may carry streams: the local driver's host-side
supervisors register over several channels, so every member registers and stays claimable (a
real gateway, real bwrap'd members)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.gateway import running_gateway, wait_pools
from tests.integration.gateway.test_warm_pools import idle, profile, write_profile
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.gateway.listening import MAX_STREAMS_PER_CONNECTION

MEMBERS = MAX_STREAMS_PER_CONNECTION + 12


async def test_more_idle_members_than_streams_per_connection_all_register(tmp_path: Path) -> None:
    pools_dir = tmp_path / "pools"
    overrides = {
        "local.pools_dir": str(pools_dir),
        "local.pool_reload_interval_seconds": 0.1,
        "local.max_pool_replicas": MEMBERS,
    }
    async with running_gateway(tmp_path / "state", **overrides) as gw:
        write_profile(pools_dir, "many", profile(MEMBERS, env='MANY = "1"'))
        await wait_pools(gw, idle("many", MEMBERS), timeout=120)
        created = await gw.create(name="last", spec=pb.SandboxSpec(environment={"MANY": "1"}))
        assert created.status.allocation == "warm"
        assert (await gw.wait_ready("last")).status.phase == pb.SANDBOX_PHASE_READY
        code, out, _ = await gw.exec("last", ["sh", "-c", "echo $MANY"])
        assert (code, out) == (0, b"1\n")
