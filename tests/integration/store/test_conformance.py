"""The store protocol's contract, run against every backend (a SQLite file and a real Postgres):
compare-and-swap, uniqueness, listing and filtering, concurrent writers, copying rows exactly."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable

import pytest

from tests.integration.store.conftest import OpenStore
from warmshell.core.errors import AlreadyExistsError, ConflictError
from warmshell.gateway.store.base import NewObject, Store, StoredObject


async def test_create_get_and_cas_update(store: Store) -> None:
    row = await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
    assert row == StoredObject("sandbox", "1", "a", "default", 1, "{}")
    assert await store.get("sandbox", "1") == row
    assert await store.get_by_name("sandbox", "default", "a") == row
    updated = await store.update(kind="sandbox", id="1", expected_version=1, payload='{"x":1}')
    assert (updated.resource_version, updated.payload) == (2, '{"x":1}')
    with pytest.raises(ConflictError, match="resource version 1"):
        await store.update(kind="sandbox", id="1", expected_version=1, payload="{}")
    assert await store.get("sandbox", "1") == updated
    with pytest.raises(ConflictError):
        await store.update(kind="sandbox", id="missing", expected_version=1, payload="{}")


async def test_conditional_and_plain_delete(store: Store) -> None:
    await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
    await store.update(kind="sandbox", id="1", expected_version=1, payload="{}")
    with pytest.raises(ConflictError):
        await store.delete("sandbox", "1", expected_version=1)
    assert await store.get("sandbox", "1") is not None
    assert await store.delete("sandbox", "1", expected_version=2)
    assert not await store.delete("sandbox", "1")
    assert not await store.delete("sandbox", "1", expected_version=2)
    # The name is free again once its object is gone.
    again = await store.create(kind="sandbox", id="2", name="a", workspace="default", payload="{}")
    assert again.resource_version == 1


async def test_identity_rules(store: Store) -> None:
    await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
    await store.create(kind="sandbox", id="2", name="a", workspace="other", payload="{}")
    await store.create(kind="pool", id="1", name="a", workspace="default", payload="{}")  # kinds are separate
    with pytest.raises(AlreadyExistsError, match="default/a"):
        await store.create(kind="sandbox", id="3", name="a", workspace="default", payload="{}")
    with pytest.raises(AlreadyExistsError):
        await store.create(kind="sandbox", id="1", name="b", workspace="default", payload="{}")
    # A refused create leaves nothing behind.
    assert await store.get("sandbox", "3") is None
    assert await store.get_by_name("sandbox", "default", "b") is None


async def test_objects_created_beside_another_are_written_all_or_none(store: Store) -> None:
    secrets = NewObject(kind="secrets", id="1", name="1", workspace="default", payload="sealed")
    row = await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}", beside=[secrets])
    assert row == StoredObject("sandbox", "1", "a", "default", 1, "{}")
    assert await store.get("secrets", "1") == StoredObject("secrets", "1", "1", "default", 1, "sealed")
    # A duplicate among those beside refuses the whole create, and one beside a duplicate name too.
    taken = NewObject(kind="secrets", id="1", name="other", workspace="default", payload="x")
    with pytest.raises(AlreadyExistsError):
        await store.create(kind="sandbox", id="2", name="b", workspace="default", payload="{}", beside=[taken])
    fresh = NewObject(kind="secrets", id="3", name="3", workspace="default", payload="y")
    with pytest.raises(AlreadyExistsError, match="default/a"):
        await store.create(kind="sandbox", id="3", name="a", workspace="default", payload="{}", beside=[fresh])
    assert await store.get("sandbox", "2") is None
    assert await store.get("sandbox", "3") is None
    assert await store.get("secrets", "3") is None
    assert [r.id for r in await store.list("secrets")] == ["1"]


async def test_rows_deleted_beside_another_go_in_the_same_statement(store: Store) -> None:
    await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
    await store.create(kind="secrets", id="1", name="1", workspace="default", payload="sealed")
    await store.create(kind="secrets", id="2", name="2", workspace="default", payload="kept")
    assert await store.delete("sandbox", "1", beside=[("secrets", "1"), ("secrets", "absent")])
    assert await store.get("sandbox", "1") is None
    assert await store.get("secrets", "1") is None
    assert [r.id for r in await store.list("secrets")] == ["2"]
    # The row itself already gone: those beside it still go (a delete finished after a crash).
    assert not await store.delete("sandbox", "1", beside=[("secrets", "2")])
    assert await store.list("secrets") == []
    with pytest.raises(ValueError, match="unconditional"):
        await store.delete("sandbox", "1", expected_version=1, beside=[("secrets", "2")])


async def test_list_filters_by_kind_and_workspace_and_orders_bytewise(store: Store) -> None:
    names = ["b", "B", "a-b", "a_b", "ab", "a", "é", "Z9"]
    for i, name in enumerate(names):
        await store.create(kind="sandbox", id=f"s{i}", name=name, workspace="w1", payload="{}")
    await store.create(kind="sandbox", id="o", name="a", workspace="w0", payload="{}")
    await store.create(kind="other", id="x", name="a", workspace="w1", payload="{}")
    listed = await store.list("sandbox", "w1")
    assert [r.name for r in listed] == sorted(names)  # code point order == UTF-8 byte order
    assert [(r.workspace, r.name) for r in await store.list("sandbox")][:2] == [("w0", "a"), ("w1", "B")]
    assert len(await store.list("sandbox")) == len(names) + 1
    assert [r.id for r in await store.list("other")] == ["x"]
    assert await store.list("sandbox", "nowhere") == []
    assert await store.list("nothing") == []


async def test_payload_round_trips_byte_for_byte(store: Store) -> None:
    # Key order, spacing and non-ASCII survive: the store holds text, not a re-encoded document.
    payload = '{"z": 1, "a": ["ü", "\\u0000", 2.50], "nested": {"k": "' + "x" * 100_000 + '"}}'
    await store.create(kind="sandbox", id="1", name="a", workspace="default", payload=payload)
    row = await store.get("sandbox", "1")
    assert row is not None
    assert row.payload == payload
    assert json.loads(row.payload)["z"] == 1


async def test_only_one_of_many_racing_writers_wins(open_store: OpenStore) -> None:
    first, second = await open_store(), await open_store()
    await first.create(kind="sandbox", id="1", name="a", workspace="default", payload="0")

    async def attempt(store: Store, n: int) -> bool:
        try:
            await store.update(kind="sandbox", id="1", expected_version=1, payload=str(n))
        except ConflictError:
            return False
        return True

    results = await asyncio.gather(*(attempt(first if n % 2 else second, n) for n in range(20)))
    assert sum(results) == 1
    row = await second.get("sandbox", "1")
    assert row is not None
    assert row.resource_version == 2
    assert row.payload == str(results.index(True))


async def test_concurrent_read_modify_write_loses_no_update(open_store: OpenStore) -> None:
    """Two clients (two replicas) increment one counter with CAS retries: every increment lands."""
    clients = [await open_store(), await open_store()]
    await clients[0].create(kind="counter", id="c", name="c", workspace="default", payload="0")
    conflicts = 0

    async def increment(store: Store) -> None:
        nonlocal conflicts
        while True:
            row = await store.get("counter", "c")
            assert row is not None
            try:
                await store.update(
                    kind="counter", id="c", expected_version=row.resource_version, payload=str(int(row.payload) + 1)
                )
                return
            except ConflictError:
                conflicts += 1

    await asyncio.gather(*(increment(clients[n % 2]) for n in range(30)))
    row = await clients[1].get("counter", "c")
    assert row is not None
    assert (row.payload, row.resource_version) == ("30", 31)
    assert conflicts > 0  # the writers really did race


async def test_a_second_client_sees_writes_and_data_outlives_clients(open_store: OpenStore) -> None:
    first = await open_store()
    await first.create(kind="sandbox", id="1", name="a", workspace="default", payload='{"kept":true}')
    await first.aclose()
    second = await open_store()
    row = await second.get("sandbox", "1")
    assert row is not None
    assert row.payload == '{"kept":true}'


async def test_restore_copies_versions_exactly_and_is_idempotent(store: Store) -> None:
    obj = StoredObject("sandbox", "1", "a", "default", 7, '{"v":7}')
    assert await store.restore(obj)
    assert await store.get("sandbox", "1") == obj
    assert not await store.restore(obj)  # the same copy again: nothing to write
    assert not await store.restore(StoredObject("sandbox", "1", "a", "default", 3, '{"v":3}'))  # older: kept
    assert await store.get("sandbox", "1") == obj
    newer = StoredObject("sandbox", "1", "a", "default", 9, '{"v":9}')
    assert await store.restore(newer)
    assert await store.get("sandbox", "1") == newer
    # CAS continues from the copied version.
    assert (await store.update(kind="sandbox", id="1", expected_version=9, payload="{}")).resource_version == 10
    with pytest.raises(AlreadyExistsError, match="another id"):
        await store.restore(StoredObject("sandbox", "2", "a", "default", 1, "{}"))


async def test_dump_returns_every_kind(store: Store) -> None:
    await store.create(kind="sandbox", id="1", name="a", workspace="default", payload="{}")
    await store.create(kind="pool", id="p", name="p", workspace="default", payload="{}")
    assert sorted((r.kind, r.id) for r in await store.dump()) == [("pool", "p"), ("sandbox", "1")]


async def test_ping_answers(store: Store) -> None:
    await store.ping()


class _Model:
    """The protocol's semantics on a dict: what every backend must agree with."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], StoredObject] = {}

    def _name_taken(self, kind: str, workspace: str, name: str, by_other_than: str) -> bool:
        return any(
            (r.kind, r.workspace, r.name) == (kind, workspace, name) and r.id != by_other_than
            for r in self.rows.values()
        )

    def create(self, kind: str, id: str, name: str, workspace: str, payload: str) -> object:
        if (kind, id) in self.rows or self._name_taken(kind, workspace, name, by_other_than=""):
            return AlreadyExistsError
        self.rows[kind, id] = StoredObject(kind, id, name, workspace, 1, payload)
        return self.rows[kind, id]

    def update(self, kind: str, id: str, expected_version: int, payload: str) -> object:
        row = self.rows.get((kind, id))
        if row is None or row.resource_version != expected_version:
            return ConflictError
        self.rows[kind, id] = StoredObject(kind, id, row.name, row.workspace, expected_version + 1, payload)
        return self.rows[kind, id]

    def delete(self, kind: str, id: str, expected_version: int | None) -> object:
        row = self.rows.get((kind, id))
        if row is None:
            return False
        if expected_version is not None and row.resource_version != expected_version:
            return ConflictError
        del self.rows[kind, id]
        return True

    def restore(self, obj: StoredObject) -> object:
        row = self.rows.get((obj.kind, obj.id))
        if row is not None and row.resource_version >= obj.resource_version:
            return False
        if self._name_taken(obj.kind, obj.workspace, obj.name, by_other_than=obj.id):
            return AlreadyExistsError
        self.rows[obj.kind, obj.id] = obj
        return True


async def _outcome(call: Awaitable[object]) -> object:
    try:
        return await call
    except (AlreadyExistsError, ConflictError) as exc:
        return type(exc)


@pytest.mark.parametrize("seed", range(3))
async def test_random_operations_agree_with_the_model(store: Store, seed: int) -> None:
    """Seeded random sequences over a small space of kinds, ids, names and versions, so that
    collisions, stale versions and re-creations are frequent; every outcome is compared."""
    rng = random.Random(seed)
    model = _Model()
    kinds, ids, names, workspaces = ["a", "b"], ["1", "2", "3"], ["x", "y"], ["w", "v"]
    for step in range(150):
        kind, id_ = rng.choice(kinds), rng.choice(ids)
        payload = f'{{"step":{step}}}'
        op = rng.choice(["create", "create", "update", "update", "delete", "restore"])
        if op == "create":
            name, ws = rng.choice(names), rng.choice(workspaces)
            got = await _outcome(store.create(kind=kind, id=id_, name=name, workspace=ws, payload=payload))
            want = model.create(kind, id_, name, ws, payload)
        elif op == "update":
            version = rng.randint(1, 4)
            got = await _outcome(store.update(kind=kind, id=id_, expected_version=version, payload=payload))
            want = model.update(kind, id_, version, payload)
        elif op == "delete":
            expected = rng.choice([None, 1, 2, 3])
            got = await _outcome(store.delete(kind, id_, expected))
            want = model.delete(kind, id_, expected)
        else:
            obj = StoredObject(kind, id_, rng.choice(names), rng.choice(workspaces), rng.randint(1, 6), payload)
            got = await _outcome(store.restore(obj))
            want = model.restore(obj)
        assert got == want, f"step {step}: {op} on {kind}/{id_}"
    assert await store.dump() == sorted(model.rows.values(), key=lambda r: (r.kind, r.id))
    for kind in kinds:
        by_name = sorted((r for r in model.rows.values() if r.kind == kind), key=lambda r: (r.workspace, r.name))
        assert await store.list(kind) == by_name
        assert await store.list(kind, "w") == [r for r in by_name if r.workspace == "w"]
