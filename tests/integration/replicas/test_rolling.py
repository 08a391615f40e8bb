"""Replicas replaced one at a time under a steady load of creates, and the shared Postgres
restarted under load: no create is lost, and the gateways recover by themselves."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.postgres import DevPostgres
from tests.helpers.replicas import Balancer, ReplicaSet, replica_set, wait_phase
from tests.integration.drivers_kubernetes.conftest import driver_config
from warmshell.api.v1 import sandbox_pb2 as pb

from .scenario import (
    apply_pool,
    check_nothing_doubled_or_orphaned,
    exec_once_connected,
    owner_of,
    spec,
    wait_all,
    wait_idle,
)

pytestmark = pytest.mark.timeout(300)


def ready(sandbox: pb.Sandbox) -> bool:
    return sandbox.status.phase == pb.SANDBOX_PHASE_READY


class SteadyCreates:
    """One create every `period` seconds through the balancer (the Service), alternating warm and
    cold, each followed until Ready; records what failed."""

    def __init__(self, replicas: ReplicaSet, front: Balancer, period: float) -> None:
        self._replicas = replicas
        self._stub = replicas.stub(front.address)
        self._period = period
        self.created: list[str] = []
        self.failures: list[str] = []
        self._accepted = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run())

    async def _run(self) -> None:
        for i in range(10_000):
            task = asyncio.create_task(self._one(f"steady-{i}", warm=i % 2 == 0))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(self._period)

    async def _one(self, name: str, *, warm: bool) -> None:
        md = self._replicas.metadata
        try:
            await self._stub.CreateSandbox(pb.CreateSandboxRequest(name=name, spec=spec(warm)), metadata=md)
        except grpc.aio.AioRpcError as exc:
            self.failures.append(f"{name}: {exc.code().name} {exc.details()}")
            return
        async with self._accepted:
            self.created.append(name)
            self._accepted.notify_all()
        try:
            # 90 s is a create lost, not a slow one: the whole roll took 50-150 s at a load of 10-30.
            await wait_phase(self._stub, md, name, timeout=90)
        except (AssertionError, grpc.aio.AioRpcError) as exc:
            self.failures.append(f"{name}: {exc}")

    async def wait_accepted(self, more: int) -> None:
        """Until `more` creates beyond those accepted so far have been accepted: each step of a
        roll overlaps creates however slow the host (a fixed pause guarantees none)."""
        async with self._accepted:
            target = len(self.created) + more
            try:
                async with asyncio.timeout(60):  # one create is started every 0.25 s
                    await self._accepted.wait_for(lambda: len(self.created) >= target)
            except TimeoutError:
                raise AssertionError(f"{more} more creates not accepted in 60 s: {self.failures}") from None

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        await asyncio.gather(*self._tasks)


async def test_a_rolling_restart_under_steady_creates_fails_none(
    replicas: ReplicaSet, admin: kc.KubeClient, service: tuple[Balancer, list[ReplicaSet]]
) -> None:
    front, _ = service
    old = [await replicas.start_one() for _ in range(3)]
    await apply_pool(replicas, admin, 4)
    await wait_idle(replicas, [replicas.stub(r.tcp) for r in old], 4)
    load = SteadyCreates(replicas, front, period=0.25)
    load.start()
    await load.wait_accepted(4)
    for replica in old:  # maxSurge 1, maxUnavailable 0: the new pod serves before the old goes
        await replicas.start_one()
        await load.wait_accepted(2)  # while both serve
        await replicas.stop(replica)
        await load.wait_accepted(2)  # after the old one went
    await load.stop()
    assert not load.failures, "\n".join(load.failures)  # whole: the last state seen says where it stalled
    assert len(load.created) >= 16
    new = [r for r in replicas.replicas if r.alive]
    assert len(new) == 3
    stub = replicas.stub(new[0].tcp)
    everything = await wait_all(stub, replicas.metadata, load.created, ready, timeout=30)
    assert {owner_of(everything[n]) for n in load.created} <= {r.id for r in new}
    await check_nothing_doubled_or_orphaned(admin, everything)
    code, out = await exec_once_connected(replicas.stub(new[1].tcp), replicas.metadata, load.created[0], ["echo", "ok"])
    assert (code, out) == (0, b"ok\n")


async def test_a_postgres_restart_under_load_is_survived_without_help(
    cluster: RunningCluster,
    own_postgres: DevPostgres,
    service: tuple[Balancer, list[ReplicaSet]],
    admin: kc.KubeClient,
    tmp_path: Path,
) -> None:
    front, holder = service
    url = await own_postgres.create_database()
    driver = driver_config(cluster, tmp_path / "unused", gateway_address=front.address)
    async with replica_set(
        tmp_path / "replicas", store_url=url, password_file=own_postgres.password_file, driver=driver
    ) as replicas:
        holder.append(replicas)
        gateways = [await replicas.start_one() for _ in range(3)]
        stubs = [replicas.stub(g.tcp) for g in gateways]
        md = replicas.metadata
        for i in range(6):
            await stubs[i % 3].CreateSandbox(pb.CreateSandboxRequest(name=f"pre-{i}", spec=spec(False)), metadata=md)
        before = [f"pre-{i}" for i in range(6)]
        await wait_all(stubs[0], md, before, ready, timeout=60)

        load = SteadyCreates(replicas, front, period=0.3)
        load.start()
        await asyncio.sleep(0.5)
        own_postgres.stop(keep=True)
        assert {await replicas.healthz(g) for g in gateways} == {503}  # NotServing while it is down
        await asyncio.sleep(2.0)
        own_postgres.restart()
        async with asyncio.timeout(30):
            while {await replicas.healthz(g) for g in gateways} != {200}:
                await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        await load.stop()
        assert all(g.alive for g in gateways), "a gateway exited during the outage"
        # Creates during the outage may fail (UNAVAILABLE), and nothing else.
        assert all("UNAVAILABLE" in f for f in load.failures if f.startswith("steady-")), load.failures
        after = [f"post-{i}" for i in range(3)]
        for i, name in enumerate(after):
            await stubs[i].CreateSandbox(pb.CreateSandboxRequest(name=name, spec=spec(False)), metadata=md)
        everything = await wait_all(stubs[1], md, before + after + load.created, ready, timeout=60)
        for i, name in enumerate(before):
            code, out = await exec_once_connected(stubs[(i + 1) % 3], md, name, ["echo", "back"])
            assert (code, out) == (0, b"back\n")
        await check_nothing_doubled_or_orphaned(admin, everything)
        holder.clear()
