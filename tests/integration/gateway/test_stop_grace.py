"""Neither a delete nor a gateway stop waits out a grace period when nothing needs it: a sandbox
whose command exits at once is gone at once, and a gateway with live sandboxes and idle pool
members stops well inside its gRPC shutdown grace (which a parked registration or an unended
supervisor stream used to make it wait in full)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers.gateway import pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.gateway import listening

POOL = 'version = 1\nworkspace = "default"\nreplicas = 2\n[environment]\nPOOL = "stop"\n'


def _our_sandboxes() -> list[int]:
    """Pids of the live bwrap processes this process started (the in-process gateway's sandboxes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if argv0.endswith(b"bwrap") and state != "Z" and int(ppid) == os.getpid():
            found.append(int(entry.name))
    return found


async def test_a_sandbox_whose_command_exits_at_once_is_deleted_at_once(tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "state") as gw:
        await gw.create(name="brief", spec=pb.SandboxSpec(command=["true"]))
        await gw.wait_for("brief", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED)
        began = time.monotonic()
        await gw.delete("brief")
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        took = time.monotonic() - began
        assert [s.name for s in listed.sandboxes] == []
        # Far below any stop grace (the local driver's 2 s, the gateway's 5 s): nothing waited.
        assert took < 1.5, f"delete took {took:.2f} s"
        assert _our_sandboxes() == []


async def test_a_stop_with_live_sandboxes_and_pool_members_does_not_wait_its_grace(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "stop.toml").write_text(POOL)
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "stop")) is not None and p.idle >= 2)
        await gw.create(name="idle")
        await gw.create(name="busy", spec=pb.SandboxSpec(command=["sleep", "600"]))
        await gw.create(name="done", spec=pb.SandboxSpec(command=["true"]))
        for name in ("idle", "busy"):
            await gw.wait_ready(name)
        await gw.wait_for("done", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED)
        assert _our_sandboxes()  # the pool's members and the live sandboxes run
        began = time.monotonic()
        await gw.gateway.stop()
        gw.stopped = True
        took = time.monotonic() - began
    assert took < listening.SHUTDOWN_GRACE_SECONDS / 2, f"stop took {took:.2f} s"
    assert _our_sandboxes() == []
