"""A gateway restart loses nothing: records come back; sandboxes whose backend died with the old
gateway are repaired to Error with a reason, and everything else keeps working."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.gateway import running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb


async def test_restart_keeps_records_and_repairs_vanished_backends(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_gateway(state) as gw:
        await gw.create(name="keep", labels={"k": "v"})
        before = await gw.wait_ready("keep")
        # Stop without deleting: the local driver's sandboxes die with their gateway.
        await gw.stop()

    async with running_gateway(state) as gw:
        after = await gw.get("keep")
        assert after.id == before.id
        assert dict(after.labels) == {"k": "v"}
        repaired = await gw.wait_for("keep", lambda s: s.status.phase == pb.SANDBOX_PHASE_ERROR, timeout=15)
        ready = next(c for c in repaired.status.conditions if c.type == "Ready")
        assert ready.reason in ("BackendVanished", "BackendFailed", "BackendExited")
        # The restarted gateway serves new sandboxes as usual.
        await gw.create(name="fresh")
        assert (await gw.wait_ready("fresh")).status.phase == pb.SANDBOX_PHASE_READY
