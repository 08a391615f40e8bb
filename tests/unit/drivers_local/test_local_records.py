"""Instance records on disk: round trip, permissions, tolerance of garbage."""

from __future__ import annotations

import stat
from pathlib import Path

from warmshell.drivers.local import records


def record(instance_id: str = "li-1") -> records.InstanceRecord:
    return records.InstanceRecord(
        instance_id=instance_id,
        credential_digest="d" * 64,
        workspace="default",
        hostname="demo",
        created_us=1,
        pid=42,
        sandbox_id="sbx",
        activation_proof="the-proof",
    )


def test_round_trip_and_permissions(tmp_path: Path) -> None:
    directory = tmp_path / "instances"
    records.save(directory, record())
    records.save(directory, record())  # replacing is fine
    assert records.load_all(directory) == [record()]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "li-1.json").stat().st_mode) == 0o600
    assert "the-proof" not in repr(record())


def test_garbage_is_skipped_and_remove_is_idempotent(tmp_path: Path) -> None:
    records.save(tmp_path, record("li-1"))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text('{"instance_id": "x"}')
    assert [r.instance_id for r in records.load_all(tmp_path)] == ["li-1"]
    records.remove(tmp_path, "li-1")
    records.remove(tmp_path, "li-1")
    assert records.load_all(tmp_path) == []
    assert records.load_all(tmp_path / "missing") == []


def test_the_sweep_removes_partial_writes_a_killed_gateway_left(tmp_path: Path) -> None:
    records.save(tmp_path, record())
    (tmp_path / "li-2.tmp").write_text('{"instance_id": "li-')  # killed mid-write
    records.remove_partial(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["li-1.json"]
    records.remove_partial(tmp_path / "missing")  # nothing to do
