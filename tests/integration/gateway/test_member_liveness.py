"""A warm member that stopped answering while idle (its agent SIGSTOPped) is spent and replaced
when a create claims it, and the create is served by another member or cold — never left
waiting (real gateway, real bwrap'd members)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tests.helpers.gateway import pool_named, running_gateway, wait_pools
from tests.integration.gateway.test_warm_pools import idle, profile, reason_of, write_profile
from warmshell.api.v1 import sandbox_pb2 as pb


async def agent_pids(gateway: object, pool: str) -> list[int]:
    """The agents (pid 1 of each sandbox) of a pool's idle members (test introspection)."""
    members = gateway.parts.driver._pools._pools[pool].members  # type: ignore[attr-defined]
    return [pid for m in members if (pid := await m.process.sandbox_pid()) is not None]


def gone(pid: int) -> bool:
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


async def test_stopped_idle_members_are_replaced_and_the_create_is_served(tmp_path: Path) -> None:
    pools_dir = tmp_path / "pools"
    overrides = {
        "local.pools_dir": str(pools_dir),
        "local.pool_reload_interval_seconds": 0.1,
        "local.member_probe_seconds": 0.5,
    }
    async with running_gateway(tmp_path / "state", **overrides) as gw:
        write_profile(pools_dir, "live", profile(2, env='LIVE = "1"'))
        await wait_pools(gw, idle("live", 2))
        stopped = await agent_pids(gw.gateway, "live")
        stopped_ids = [m.instance_id for m in gw.gateway.parts.driver._pools._pools["live"].members]  # type: ignore[attr-defined]
        assert len(stopped) == 2
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            created = await gw.create(name="served", spec=pb.SandboxSpec(environment={"LIVE": "1"}))
            ready = await gw.wait_ready("served")
            elapsed = time.monotonic() - start
        finally:
            for pid in stopped:
                if not gone(pid):
                    os.kill(pid, signal.SIGCONT)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        # Both members failed their probe; the create was served by a replacement that registered
        # meanwhile, or cold — not by either stopped member.
        assert ready.status.instance_id not in stopped_ids
        if created.status.allocation == "cold":
            assert reason_of(ready) == ("PoolMiss", "Empty")
        assert elapsed < 15, elapsed
        code, out, _ = await gw.exec("served", ["sh", "-c", "echo $LIVE"])
        assert (code, out) == (0, b"1\n")
        # The stopped members were spent (killed even though stopped) and the pool refilled. The
        # refill does not wait for them to go (registration is quick: it may be done by now), and
        # a spent member ends once continued above, or at the driver's kill grace (2 s) if not.
        refilled = await wait_pools(gw, idle("live", 2))
        async with asyncio.timeout(10):
            while not all(gone(pid) for pid in stopped):
                await asyncio.sleep(0.05)
        assert set(await agent_pids(gw.gateway, "live")).isdisjoint(stopped)
        live = pool_named(refilled, "live")
        assert live is not None
        assert live.hits == (1 if created.status.allocation == "warm" else 0)
        # A create now is served warm by a replacement.
        again = await gw.create(name="warm", spec=pb.SandboxSpec(environment={"LIVE": "1"}))
        assert again.status.allocation == "warm"
        assert (await gw.wait_ready("warm")).status.phase == pb.SANDBOX_PHASE_READY


async def test_a_stopped_idle_member_is_replaced_before_any_create_claims_it(tmp_path: Path) -> None:
    pools_dir = tmp_path / "pools"
    overrides = {
        "local.pools_dir": str(pools_dir),
        "local.pool_reload_interval_seconds": 0.1,
        "local.member_probe_seconds": 0.3,
        "local.member_check_seconds": 0.2,
    }
    async with running_gateway(tmp_path / "state", **overrides) as gw:
        write_profile(pools_dir, "live", profile(2, env='LIVE = "2"'))
        await wait_pools(gw, idle("live", 2))
        first, second = await agent_pids(gw.gateway, "live")
        os.kill(first, signal.SIGSTOP)
        try:
            # No create: the periodic check spends it (killed although stopped) and refills.
            async with asyncio.timeout(15):
                while not gone(first):
                    await asyncio.sleep(0.05)
            refilled = await wait_pools(gw, idle("live", 2))
        finally:
            if not gone(first):
                os.kill(first, signal.SIGCONT)
        current = await agent_pids(gw.gateway, "live")
        assert second in current
        assert first not in current
        live = pool_named(refilled, "live")
        assert live is not None
        assert (live.hits, live.misses) == (0, 0)
        # Creates now are warm and never meet the stopped member's probe deadline.
        for name in ("a", "b"):
            start = time.monotonic()
            created = await gw.create(name=name, spec=pb.SandboxSpec(environment={"LIVE": "2"}))
            assert created.status.allocation == "warm"
            assert (await gw.wait_ready(name)).status.phase == pb.SANDBOX_PHASE_READY
            assert time.monotonic() - start < 5
