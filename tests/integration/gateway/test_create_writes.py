"""A warm create on a real gateway writes its record few times: what happens while the create is
in flight (its activation, the driver's first view of the claimed member) is stored with the
create's own write, and the stored row has all of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.gateway import count_updates, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.models import Phase, SandboxRecord
from warmshell.gateway.records import KIND_SANDBOX

PROFILE = 'version = 1\nworkspace = "default"\nreplicas = 2\n[environment]\nPOOL = "writes"\n'


async def test_a_warm_create_is_stored_in_at_most_two_writes_after_its_insert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "writes.toml").write_text(PROFILE)
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "writes")) is not None and p.idle >= 2)
        store = gw.gateway.parts.store
        updated = count_updates(store, monkeypatch)
        created = await gw.create(name="counted", spec=pb.SandboxSpec(environment={"POOL": "writes"}))
        assert created.status.allocation == "warm"
        await gw.wait_for("counted", lambda s: s.status.phase == pb.SANDBOX_PHASE_READY)
        # The create's result (its activation and the driver's first view folded in), then the
        # session unless it opened early enough to be folded in too.
        assert 1 <= updated.count(created.id) <= 2, updated
        row = await store.get(KIND_SANDBOX, created.id)
        assert row is not None
        stored = SandboxRecord.model_validate_json(row.payload)
        timeline = stored.status.timeline
        assert timeline.claimed_us > 0
        assert timeline.activated_us > 0
        assert timeline.ready_us >= timeline.activated_us
        assert stored.status.instance_id
        assert stored.status.phase == Phase.READY
        # The incarnation the activation recorded is the one whose session opened.
        assert stored.status.connected_incarnation == stored.status.activated_incarnation >= 0
