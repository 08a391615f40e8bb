"""Persist-then-provision with the in-memory FakeDriver: failures leave nothing behind."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from warmshell.core import pausing, specs
from warmshell.core.deadlines import ProvisioningDeadlines
from warmshell.core.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.core.models import Allocation, Condition, Phase, SandboxRecord, SandboxStatus
from warmshell.drivers.base import BackendState, CreateRequest, DriverCondition, DriverSandbox
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway import manager as manager_module
from warmshell.gateway.events import EventBus
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.sessions import SessionTable
from warmshell.gateway.store.sqlite import open_sqlite_store


@pytest.fixture
async def records(tmp_path: Path) -> AsyncIterator[SandboxRecords]:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    yield SandboxRecords(store, EventBus())
    await store.aclose()


def manager_for(records: SandboxRecords, driver: FakeDriver, **options: Any) -> SandboxManager:
    return SandboxManager(
        records=records,
        driver=driver,
        bus=EventBus(),
        sessions=SessionTable(),
        vault=SecretVault(records._store, bytes(32)),
        **options,
    )


CREATE = {"workspace": "", "image": "", "environment": {}, "cpu": "", "memory": "", "command": [],
          "runtime_class_name": "", "labels": {}}  # fmt: skip


def new(name: str) -> specs.NewSandbox:
    fields = dict(CREATE)
    placement = {key: fields.pop(key) for key in ("workspace", "labels")}
    return specs.new_sandbox(name=name, spec=lambda: specs.build_spec(**fields), **placement)  # type: ignore[arg-type]


async def test_driver_failure_removes_the_row(records: SandboxRecords) -> None:
    def fail(request: CreateRequest) -> None:
        raise InvalidArgumentError("spec.image", "the backend cannot pull it")

    manager = manager_for(records, FakeDriver(fail))
    with pytest.raises(InvalidArgumentError, match="cannot pull"):
        await manager.create(new("x"))
    assert await records.list() == []


async def test_driver_failure_removes_the_row_and_its_sealed_secrets_in_one_delete(
    records: SandboxRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(request: CreateRequest) -> None:
        raise InvalidArgumentError("spec.image", "the backend cannot pull it")

    store = records._store
    deletes: list[object] = []
    delete = store.delete

    async def counted(kind: str, id: str, expected_version: int | None = None, **options: Any) -> bool:
        deletes.append(options.get("beside"))
        return await delete(kind, id, expected_version, **options)

    monkeypatch.setattr(store, "delete", counted)
    fields = {k: v for k, v in CREATE.items() if k not in ("workspace", "labels")}
    with_secrets = specs.new_sandbox(
        workspace="",
        name="x",
        labels={},
        spec=lambda: specs.build_spec(**fields),
        secrets={"TOKEN": "s3cret"},  # type: ignore[arg-type]
    )
    with pytest.raises(InvalidArgumentError, match="cannot pull"):
        await manager_for(records, FakeDriver(fail)).create(with_secrets)
    assert len(deletes) == 1
    assert await store.dump() == []


async def test_unknown_outcome_keeps_the_provisioning_row(records: SandboxRecords) -> None:
    def unknown(request: CreateRequest) -> None:
        raise UnavailableError("timed out talking to the backend")

    manager = manager_for(records, FakeDriver(unknown))
    with pytest.raises(UnavailableError):
        await manager.create(new("x"))
    [kept] = await records.list()
    assert kept.name == "x"
    assert kept.status.phase.value == "Provisioning"


async def test_generated_names_and_proof_hash_stored(records: SandboxRecords) -> None:
    manager = manager_for(records, FakeDriver())
    record = await manager.create(new(""))
    assert record.name.startswith("sbx-")
    assert len(record.activation_proof_hash) == 64
    assert record.status.timeline.requested_us <= record.status.timeline.backend_created_us


async def test_a_sandbox_stuck_provisioning_goes_error_naming_the_step(records: SandboxRecords) -> None:
    driver = FakeDriver()
    manager = manager_for(records, driver, deadlines=ProvisioningDeadlines(cold_seconds=0.3, warm_seconds=0.1))
    created = await manager.create(new("stuck"))  # no supervisor ever connects
    assert created.status.phase == Phase.PROVISIONING

    async def settled() -> SandboxRecord:
        while True:
            record = await records.get(created.id)
            assert record is not None
            if record.status.phase != Phase.PROVISIONING:
                return record
            await asyncio.sleep(0.02)

    record = await asyncio.wait_for(settled(), timeout=10)
    assert record.status.phase == Phase.ERROR
    ready = record.status.condition("Ready")
    assert ready is not None
    assert ready.reason == "ProvisioningTimeout"
    assert "not Ready within 0.3s (cold)" in ready.message
    assert "stuck waiting for its supervisor to register" in ready.message
    assert await driver.get(created.id) is None  # its backend was removed; the record stays


async def test_a_driver_view_that_repeats_the_record_is_not_written(records: SandboxRecords) -> None:
    driver = FakeDriver()
    manager = manager_for(records, driver)
    created = await manager.create(new("x"))
    view = await driver.get(created.id)
    assert view is not None
    await manager.on_driver_event_view(view)  # what the create stored: no write
    unchanged = await records.get(created.id)
    assert unchanged is not None
    assert unchanged.resource_version == created.resource_version
    moved = dataclasses.replace(view, conditions=(DriverCondition("ResourceLimits", "True", "Applied", "1 cpu"),))
    await manager.on_driver_event_view(moved)
    changed = await records.get(created.id)
    assert changed is not None
    assert changed.resource_version == created.resource_version + 1


async def test_busy_while_a_create_is_in_flight_and_just_after_it(
    records: SandboxRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the collector's full passes wait on (gateway/collector.py)."""
    seen: list[bool] = []

    def driver_create(request: CreateRequest) -> None:
        seen.append(manager.busy())
        if request.name == "fails":
            raise InvalidArgumentError("spec.image", "the backend cannot pull it")

    manager = manager_for(records, FakeDriver(driver_create))
    assert not manager.busy()
    await manager.create(new("x"))
    assert seen == [True]
    assert manager.busy()  # one just started: it may be one of a sequence
    with pytest.raises(InvalidArgumentError):
        await manager.create(new("fails"))
    assert seen == [True, True]
    monkeypatch.setattr(manager_module, "QUIET_SECONDS", 0.0)
    assert not manager.busy()  # a failed create is no longer in flight either


async def test_a_delete_forgets_the_secrets_of_a_sandbox_that_had_some_and_writes_nothing_for_one_without(
    records: SandboxRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = manager_for(records, FakeDriver())
    store = records._store
    fields = {k: v for k, v in CREATE.items() if k not in ("workspace", "labels")}
    with_secrets = specs.new_sandbox(
        workspace="",
        name="sealed",
        labels={},
        spec=lambda: specs.build_spec(**fields),
        secrets={"TOKEN": "s3cret"},  # type: ignore[arg-type]
    )
    sealed = await manager.create(with_secrets)
    plain = await manager.create(new("plain"))
    assert await manager.vault.get(sealed.id) == {"TOKEN": "s3cret"}
    deleted: list[list[tuple[str, str]]] = []
    delete = store.delete

    async def counted(kind: str, id: str, expected_version: int | None = None, **options: Any) -> bool:
        deleted.append([(kind, id), *options.get("beside", ())])
        return await delete(kind, id, expected_version, **options)

    monkeypatch.setattr(store, "delete", counted)
    await manager.delete(plain.workspace, plain.name)
    assert deleted == [[("sandbox", plain.id)]]
    await manager.delete(sealed.workspace, sealed.name)
    # One store delete, the record's, with its sealed secrets beside it.
    assert deleted[1:] == [[("sandbox", sealed.id), ("sealed-secrets", sealed.id)]]
    assert await store.get("sealed-secrets", sealed.id) is None
    assert await store.get("sandbox", sealed.id) is None


async def test_the_secrets_are_sealed_in_the_records_own_write_and_a_refused_create_leaves_neither(
    records: SandboxRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = records._store
    inserted: list[list[str]] = []
    create = store.create

    async def counted(**row: Any) -> Any:
        inserted.append([row["kind"], *(beside.kind for beside in row.get("beside", ()))])
        return await create(**row)

    monkeypatch.setattr(store, "create", counted)
    manager = manager_for(records, FakeDriver())
    fields = {k: v for k, v in CREATE.items() if k not in ("workspace", "labels")}

    def with_secrets(name: str) -> specs.NewSandbox:
        return specs.new_sandbox(
            workspace="",
            name=name,
            labels={},
            spec=lambda: specs.build_spec(**fields),
            secrets={"TOKEN": "s3cret"},  # type: ignore[arg-type]
        )

    created = await manager.create(with_secrets("sealed"))
    assert inserted == [["sandbox", "sealed-secrets"]]  # one write, the record's
    row = await store.get("sealed-secrets", created.id)
    assert row is not None
    assert "s3cret" not in row.payload
    assert await manager.vault.get(created.id) == {"TOKEN": "s3cret"}
    with pytest.raises(AlreadyExistsError):
        await manager.create(with_secrets("sealed"))
    assert [r.id for r in await store.list("sealed-secrets")] == [created.id]
    assert [r.id for r in await records.list()] == [created.id]


_STATES = st.sampled_from(["", "Pending", "Running", "Exited", "Failed"])
_CONDITIONS = st.lists(
    st.builds(
        DriverCondition,
        type=st.sampled_from(["ResourceLimits", "ClaimBound", "SandboxReady"]),  # never the gateway's Ready
        status=st.sampled_from(["True", "False"]),
        reason=st.sampled_from(["", "A", "B"]),
        message=st.sampled_from(["", "m"]),
    ),
    max_size=3,
    unique_by=lambda c: c.type,  # as a backend reports them: one of each type
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    phase=st.sampled_from(list(Phase)),
    instance=st.sampled_from(["", "i-1", "i-2"]),
    backend=_STATES,
    connected=st.booleans(),
    exit_code=st.sampled_from([None, 0, 3]),
    had=_CONDITIONS,
    ready=st.sampled_from([None, ("True", "SupervisorConnected"), ("False", "BackendNotRunning"), ("False", "Error")]),
    view_instance=st.sampled_from(["", "i-1", "i-2"]),
    view_state=_STATES,
    view_conditions=_CONDITIONS,
    pool=st.sampled_from(["", "p"]),
    view_pool=st.sampled_from(["", "p", "q"]),
)
def test_a_view_changes_the_fields_compared_exactly_when_it_changes_the_encoded_status(
    phase: Phase,
    instance: str,
    backend: str,
    connected: bool,
    exit_code: int | None,
    had: list[DriverCondition],
    ready: tuple[str, str] | None,
    view_instance: str,
    view_state: str,
    view_conditions: list[DriverCondition],
    pool: str,
    view_pool: str,
) -> None:
    # The cheap comparison `on_driver_event_view` makes stands for comparing the whole status.
    status = SandboxStatus(
        phase=phase, instance_id=instance, backend_state=backend, supervisor_connected=connected, exit_code=exit_code
    )
    if pool:
        status.allocation, status.pool = Allocation.WARM, pool
    for c in had:
        status.set_condition(Condition(type=c.type, status=c.status, reason=c.reason, message=c.message))
    if ready is not None:
        status.set_condition(Condition(type="Ready", status=ready[0], reason=ready[1]))
    record = SandboxRecord(id=SandboxId("s"), name="s", status=status)
    view = DriverSandbox(
        SandboxId("s"), view_instance, BackendState(view_state) if view_state else BackendState.PENDING,
        conditions=tuple(view_conditions), allocation=Allocation.WARM if view_pool else Allocation.COLD, pool=view_pool,
    )  # fmt: skip
    encoded, fields = record.status.model_dump(exclude={"backend_seen_ms"}), manager_module._view_fields(record.status)
    manager_module._apply_driver_view(record, view)
    assert (record.status.model_dump(exclude={"backend_seen_ms"}) != encoded) == (
        manager_module._view_fields(record.status) != fields
    )


def test_a_relisted_view_gives_back_the_pool_a_crash_lost() -> None:
    # The create's result is written once the sandbox is Ready when its caller waits
    # (`_release_created`); a crash before that leaves the record without its pool, which decides
    # a pod's egress policy. The next start's relist takes it back from the backend.
    record = SandboxRecord(id=SandboxId("s"), name="s")
    view = DriverSandbox(SandboxId("s"), "i-1", BackendState.RUNNING, allocation=Allocation.WARM, pool="small")
    manager_module._apply_driver_view(record, view)
    assert (record.status.allocation, record.status.pool) == (Allocation.WARM, "small")
    other = DriverSandbox(SandboxId("s"), "i-1", BackendState.RUNNING, allocation=Allocation.WARM, pool="large")
    manager_module._apply_driver_view(record, other)
    assert record.status.pool == "small", "a pool the record names is never replaced"


async def test_a_deleted_sandboxs_supervisor_is_told_to_stop_not_to_reconnect(records: SandboxRecords) -> None:
    """A session that just ends looks to its supervisor like a lost gateway: it reconnects, to be
    refused NOT_FOUND, unless its pod is gone first. A delete says the sandbox is over."""
    manager = manager_for(records, FakeDriver())
    record = await manager.create(new("gone"))
    session = manager.sessions.open(record.id, "instance")
    await manager.delete(record.workspace, record.name)
    sent = [session.outbox.get_nowait() for _ in range(session.outbox.qsize())]
    assert sent[-1] is None  # the stream ends
    shutdowns = [message.shutdown for message in sent[:-1] if message is not None and message.HasField("shutdown")]
    assert [s.reconnect for s in shutdowns] == [False], sent


async def test_a_delete_during_a_resume_leaves_no_backend_and_the_resume_says_so(records: SandboxRecords) -> None:
    """A delete that lands while the driver starts the resumed backend: the delete's own driver
    call finds nothing yet, so the resume must remove what its create made, and answer that the
    sandbox is gone rather than with a record in phase Deleting."""
    gate, entered = asyncio.Event(), asyncio.Event()
    gate.set()

    class SlowCreates(FakeDriver):
        async def create(self, request: CreateRequest) -> DriverSandbox:
            entered.set()
            await gate.wait()
            return await super().create(request)

    driver = SlowCreates()
    manager = manager_for(records, driver)
    record = await manager.create(new("napper"))
    await records.mutate(record.id, lambda r: pausing.mark_paused(r, "img", now_ms=1, pause_ttl_seconds=0))
    await driver.delete(record.id)
    gate.clear()
    entered.clear()
    resuming = asyncio.create_task(manager.resume(await records.get(record.id)))
    await entered.wait()
    await manager.delete(record.workspace, record.name)
    gate.set()
    with pytest.raises(NotFoundError, match="deleted while it was resuming"):
        await resuming
    assert await driver.get(record.id) is None
    assert await records.get(record.id) is None
