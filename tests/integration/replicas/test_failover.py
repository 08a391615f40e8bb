"""Three gateway replicas on kubesim and one Postgres: thirty sandboxes, warm and cold, created
through different replicas; then one replica is killed with SIGKILL in the middle of a burst of
creates and execs. Its supervisors reconnect through the balancer to the survivors."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from kubesim.controllers import client as kc
from tests.helpers.replicas import ReplicaSet
from warmshell.api.v1 import sandbox_pb2 as pb

from .scenario import (
    apply_pool,
    check_nothing_doubled_or_orphaned,
    exec_via,
    owner_of,
    spec,
    survivors,
    wait_all,
    wait_idle,
)

pytestmark = pytest.mark.timeout(300)

HEARTBEAT_SECONDS = 2.0
HEARTBEAT_TIMEOUT_SECONDS = 3 * HEARTBEAT_SECONDS  # MISSED_HEARTBEATS intervals
SANDBOXES = 30
BURST = 24


def ready(sandbox: pb.Sandbox) -> bool:
    return sandbox.status.phase == pb.SANDBOX_PHASE_READY


def settled(sandbox: pb.Sandbox) -> bool:
    return sandbox.status.phase != pb.SANDBOX_PHASE_PROVISIONING


async def test_kill_9_of_one_replica_mid_burst_loses_and_doubles_nothing(
    replicas: ReplicaSet, admin: kc.KubeClient
) -> None:
    replicas.settings["heartbeat_interval_seconds"] = HEARTBEAT_SECONDS
    gateways = [await replicas.start_one() for _ in range(3)]
    stubs = [replicas.stub(g.tcp) for g in gateways]
    md = replicas.metadata
    await apply_pool(replicas, admin, 6)
    await wait_idle(replicas, stubs, 6)

    # Thirty sandboxes, every other one warm, each through the next replica.
    limit = asyncio.Semaphore(8)

    async def create(i: int, stub_index: int) -> pb.Sandbox:
        async with limit:
            request = pb.CreateSandboxRequest(name=f"sb-{i}", spec=spec(warm=i % 2 == 0))
            return await stubs[stub_index].CreateSandbox(request, metadata=md)

    first = await asyncio.gather(*(create(i, i % 3) for i in range(SANDBOXES)))
    names = [s.name for s in first]
    before = await wait_all(stubs[1], md, names, ready, timeout=120)
    assert {s.status.allocation for s in before.values()} == {"warm", "cold"}
    assert len({owner_of(s) for s in before.values()}) > 1, "every session landed on one replica"
    for i, name in enumerate(names):  # each sandbox through a replica other than its own
        code, out = await exec_via(stubs[(i + 1) % 3], md, name, ["echo", name])
        assert (code, out) == (0, f"{name}\n".encode())

    # The burst: creates through every replica and execs of every sandbox; replica 0 dies in it.
    victim = gateways[0]
    held = [n for n in names if owner_of(before[n]) == victim.id]
    assert held, "the victim held no session: killing it would test nothing"
    created: list[str] = []
    failed: list[tuple[int, grpc.StatusCode]] = []  # (replica, code) of every failed burst call

    async def burst_create(i: int) -> None:
        await asyncio.sleep(0.04 * (i - SANDBOXES))  # spread over the kill
        try:
            sandbox = await create(i, i % 3)
        except grpc.aio.AioRpcError as exc:
            failed.append((i % 3, exc.code()))
            return
        created.append(sandbox.name)

    async def burst_exec(name: str, via: int) -> None:
        try:
            await exec_via(stubs[via], md, name, ["true"])
        except grpc.aio.AioRpcError as exc:
            failed.append((via, exc.code()))

    work = [asyncio.create_task(burst_create(SANDBOXES + i)) for i in range(BURST)]
    work += [asyncio.create_task(burst_exec(n, i % 3)) for i, n in enumerate(names)]
    await asyncio.sleep(0.3)
    replicas.kill(victim)
    killed_at = time.monotonic()
    await asyncio.gather(*work)
    # Only calls to the victim failed, or execs whose session was on it (retryable: its
    # supervisor is reconnecting to a survivor).
    assert all(via == 0 or code == grpc.StatusCode.UNAVAILABLE for via, code in failed), failed
    assert {code for _, code in failed} <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}, failed

    # Every sandbox that was Ready is Ready again, on a survivor, within the heartbeat timeout.
    alive = {r.id for r in survivors(replicas)}
    back = await wait_all(
        stubs[1], md, names, lambda s: ready(s) and owner_of(s) in alive, timeout=HEARTBEAT_TIMEOUT_SECONDS + 2.0
    )
    took = time.monotonic() - killed_at
    assert took <= HEARTBEAT_TIMEOUT_SECONDS + 2.0, took
    for name in names:
        for via in (1, 2):
            code, out = await exec_via(stubs[via], md, name, ["echo", "again"])
            assert (code, out) == (0, b"again\n"), (name, via)

    # Every create that returned exists exactly once and becomes Ready; the ones in flight on the
    # victim either completed or settled (Ready, or Error with nothing behind them).
    everything = await wait_all(stubs[2], md, created, ready, timeout=90)
    everything = await wait_all(stubs[2], md, list(everything), settled, timeout=60)
    assert len(everything) >= SANDBOXES + len(created)
    assert set(names) | set(created) <= set(everything)
    await check_nothing_doubled_or_orphaned(admin, everything)
    assert back.keys() >= set(names)
