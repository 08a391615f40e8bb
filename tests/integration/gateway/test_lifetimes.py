"""Sandbox lifetimes on a real gateway: a TTL or an idle timeout ends in deletion, a plain create
gets a finite TTL ("never" is the operator's choice), an Exited sandbox goes after its retention,
RefreshTtl extends a TTL, the gateway's maximum is enforced with the field named, and expiry is
stored, so a gateway restart does not forget it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb

FAST = {"lifetimes.check_interval_seconds": 0.1}


async def _events_until_deleted(gw: RunningGateway, name: str, timeout: float) -> list[pb.SandboxEvent]:
    """Every watch event of `name` until it is deleted (fails if it outlives `timeout`); none when
    it was already gone as the watch opened."""
    events: list[pb.SandboxEvent] = []
    call = gw.stub.WatchSandbox(pb.WatchSandboxRequest(name=name), metadata=gw.metadata)
    try:
        async with asyncio.timeout(timeout):
            async for event in call:
                events.append(event)
                if event.HasField("deleted"):
                    return events
    except grpc.aio.AioRpcError as exc:
        if exc.code() is not grpc.StatusCode.NOT_FOUND or events:
            raise
        return events
    finally:
        call.cancel()
    raise AssertionError(f"the watch of {name} ended before it was deleted: {events}")


async def _gone(gw: RunningGateway, name: str) -> bool:
    try:
        await gw.get(name)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
    else:
        return False
    if code is not grpc.StatusCode.NOT_FOUND:
        raise AssertionError(f"GetSandbox {name} failed with {code}")
    return True


@pytest.fixture
async def gw(tmp_path: Path) -> Any:
    async with running_gateway(tmp_path / "state", **FAST) as running:
        yield running


async def test_a_sandbox_is_deleted_when_its_ttl_ends(gw: RunningGateway) -> None:
    created = await gw.create(name="brief", ttl_seconds=2)
    assert created.lifetime.ttl_seconds == 2
    assert 1900 <= created.lifetime.expires_at_ms - created.created_at_ms <= 2100
    events = await _events_until_deleted(gw, "brief", timeout=10)
    assert time.time() * 1000 >= created.lifetime.expires_at_ms
    reasons = [e.progress.reason for e in events if e.HasField("progress")]
    assert "TtlExpired" in reasons
    expired = [
        e.sandbox
        for e in events
        if e.HasField("sandbox") and any(c.type == "Expired" for c in e.sandbox.status.conditions)
    ]
    assert expired, "watchers see why the sandbox went"
    assert await _gone(gw, "brief")


async def test_refresh_ttl_extends_the_lifetime(gw: RunningGateway) -> None:
    # Long enough to outlast the create itself on a loaded host (with 2 s, a create that took
    # that long was expired before its refresh); the wait below is only what is left of it.
    created = await gw.create(name="extended", ttl_seconds=5)
    refreshed = await gw.stub.RefreshTtl(pb.RefreshTtlRequest(name="extended", ttl_seconds=600), metadata=gw.metadata)
    assert refreshed.lifetime.ttl_seconds == 600
    assert refreshed.lifetime.expires_at_ms >= created.lifetime.expires_at_ms + 595_000  # now + 600 s
    # Past the first expiry: nothing to wait on but time itself.
    await asyncio.sleep(max(created.lifetime.expires_at_ms / 1000 - time.time(), 0) + 0.5)
    assert (await gw.get("extended")).lifetime.expires_at_ms == refreshed.lifetime.expires_at_ms


async def test_a_plain_create_expires_and_a_ttl_past_the_maximum_is_refused(gw: RunningGateway) -> None:
    created = await gw.create(name="plain")
    assert created.lifetime.ttl_seconds == 3600  # the gateway's default: a crashed client leaks for an hour
    assert 3_599_000 <= created.lifetime.expires_at_ms - created.created_at_ms <= 3_601_000
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gw.create(name="long", ttl_seconds=999999)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "ttl_seconds: 999999 s is beyond the gateway's maximum of 86400 s ([lifetimes] max_ttl_seconds)"
    )


async def test_never_is_the_operators_explicit_choice(tmp_path: Path) -> None:
    never = {**FAST, "lifetimes.default_ttl_seconds": 0, "lifetimes.max_ttl_seconds": 0}
    async with running_gateway(tmp_path / "state", **never) as gw:
        created = await gw.create(name="forever")
        assert (created.lifetime.ttl_seconds, created.lifetime.expires_at_ms) == (0, 0)


async def test_an_exited_sandbox_is_deleted_after_its_retention(tmp_path: Path) -> None:
    settings = {**FAST, "lifetimes.exited_retention_seconds": 1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await gw.create(name="once", spec=pb.SandboxSpec(command=["true"]))
        exited = await gw.wait_for("once", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED)
        assert exited.lifetime.expires_at_ms > time.time() * 1000 + 3_000_000  # its TTL is far off
        events = await _events_until_deleted(gw, "once", timeout=10)
        assert "ExitedRetention" in [e.progress.reason for e in events if e.HasField("progress")]
        assert time.time() * 1_000_000 >= exited.status.timeline.exited_us + 1_000_000
        assert await _gone(gw, "once")


async def test_an_idle_sandbox_is_deleted_but_a_running_command_keeps_it(gw: RunningGateway) -> None:
    # The idle clock starts at the create: 5 s outlasts a create to Ready on a loaded host (with
    # 3 s, one that took that long was deleted as idle before it was Ready).
    await gw.create(name="idle", idle_timeout_seconds=5)
    await gw.wait_ready("idle")
    started = time.monotonic()
    code, _, _ = await gw.exec("idle", ["sleep", "6"])  # longer than the idle timeout
    assert code == 0
    assert time.monotonic() - started >= 6
    assert not await _gone(gw, "idle")  # the command counted as activity
    events = await _events_until_deleted(gw, "idle", timeout=15)  # its 5 s idle, then the pass, on a loaded host
    assert "IdleTimeout" in [e.progress.reason for e in events if e.HasField("progress")]


async def test_the_maximum_is_enforced_with_the_field_named(tmp_path: Path) -> None:
    limits = {
        **FAST,
        "lifetimes.default_ttl_seconds": 60,
        "lifetimes.max_ttl_seconds": 120,
    }
    async with running_gateway(tmp_path / "state", **limits) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.create(name="long", ttl_seconds=121)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            "ttl_seconds: 121 s is beyond the gateway's maximum of 120 s ([lifetimes] max_ttl_seconds)"
        )
        assert await _gone(gw, "long")  # nothing half-made
        with pytest.raises(grpc.aio.AioRpcError) as unlimited:
            await gw.create(name="long", ttl_seconds=0)
        assert (unlimited.value.details() or "").startswith("ttl_seconds: 0 (no limit) is not allowed")
        defaulted = await gw.create(name="default")
        assert defaulted.lifetime.ttl_seconds == 60
        with pytest.raises(grpc.aio.AioRpcError) as refresh:
            await gw.stub.RefreshTtl(pb.RefreshTtlRequest(name="default", ttl_seconds=500), metadata=gw.metadata)
        assert refresh.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (refresh.value.details() or "").startswith("ttl_seconds: 500 s is beyond")


async def test_expiry_survives_a_gateway_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # The first gateway checks once at start (before the create) and then not for ten minutes, so
    # only the restarted one, which never saw the create, can enforce the stored expiry.
    async with running_gateway(state, **{"lifetimes.check_interval_seconds": 600}) as gw:
        # Longer than the stop and restart take, so the restarted gateway reads it before it is
        # due: from the create to the restarted gateway's first answer is 0.3 s on 2 loaded cores
        # (the stop ends the supervisors' streams first, so no call holds its grace).
        created = await gw.create(name="outlives", ttl_seconds=4)
        await gw.wait_ready("outlives")
        await gw.stop()  # as SIGTERM would; the record stays in the store
    async with running_gateway(state, **FAST) as gw:
        after = await gw.get("outlives")
        assert after.lifetime.expires_at_ms == created.lifetime.expires_at_ms
        await _events_until_deleted(gw, "outlives", timeout=15)
        assert time.time() * 1000 >= created.lifetime.expires_at_ms
        assert await _gone(gw, "outlives")


async def test_a_pool_profile_sets_the_default_lifetime_of_what_it_serves(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    profile = 'version = 1\nworkspace = "default"\nreplicas = 1\n[environment]\nPOOL = "short"\n'
    (pools / "short.toml").write_text(profile + "[lifetime]\nttl_seconds = 1\n")
    settings = {**FAST, "local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "short")) is not None and p.idle >= 1)
        served = await gw.create(name="pooled", spec=pb.SandboxSpec(environment={"POOL": "short"}))
        assert served.status.allocation == "warm"
        assert served.lifetime.ttl_seconds == 1  # the profile's default
        await _events_until_deleted(gw, "pooled", timeout=10)
        cold = await gw.create(name="cold")  # no pool: the gateway's default
        assert cold.lifetime.ttl_seconds == 3600
