"""What the replica tests share: a warm pool on kubesim, creates and execs through chosen replicas,
and the checks that nothing was lost, doubled or left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from kubesim.controllers import client as kc
from tests.helpers.replicas import Replica, ReplicaSet
from tests.integration.drivers_kubernetes.conftest import IMAGE, NAMESPACE
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.fingerprints import SandboxShape
from warmshell.drivers.kubernetes import labels
from warmshell.drivers.kubernetes.warm import warmpools

POOL = "replicas"
WARM_ENV = {"FOO": "bar"}
Stub = sandbox_pb2_grpc.SandboxServiceStub


async def apply_pool(replicas: ReplicaSet, admin: kc.KubeClient, size: int) -> None:
    shape = SandboxShape(workspace="default", image=IMAGE, environment=WARM_ENV)
    template, pool = warmpools.render_pool_pair(
        replicas.driver, name=POOL, namespace=NAMESPACE, shape=shape, replicas=size
    )
    await admin.create(kc.TEMPLATES, NAMESPACE, template)
    await admin.create(kc.POOLS, NAMESPACE, pool)


async def wait_idle(replicas: ReplicaSet, stubs: Sequence[Stub], at_least: int, timeout: float = 60.0) -> None:
    """Until the pool's members have registered (spread over the replicas: each counts its own)."""
    async with asyncio.timeout(timeout):
        while True:
            idle = 0
            for stub in stubs:
                listed = await stub.ListPools(pb.ListPoolsRequest(), metadata=replicas.metadata)
                idle += sum(p.idle for p in listed.pools if p.name == POOL)
            if idle >= at_least:
                return
            await asyncio.sleep(0.1)  # pools have no watch


def spec(warm: bool) -> pb.SandboxSpec:
    return pb.SandboxSpec(environment=WARM_ENV if warm else {"FOO": "cold"})


def owner_of(sandbox: pb.Sandbox) -> str:
    """The replica holding the session, from the SupervisorConnected condition ("session gw-1/s3")."""
    condition = next((c for c in sandbox.status.conditions if c.type == "SupervisorConnected"), None)
    if condition is None or condition.status != "True":
        return ""
    return condition.message.removeprefix("session ").split("/")[0]


async def exec_via(stub: Stub, metadata: Any, name: str, command: Sequence[str]) -> tuple[int, bytes]:
    out, code = b"", -1
    async for event in stub.ExecSandbox(pb.ExecSandboxRequest(name=name, command=list(command)), metadata=metadata):
        kind = event.WhichOneof("event")
        if kind == "stdout":
            out += event.stdout
        elif kind == "exit_code":
            code = event.exit_code
    return code, out


# A supervisor whose session went (its replica stopped, the store down) is accepted anywhere
# once the close is recorded (at the latest the next reconcile pass, 10 s, when the store missed
# it) and tries again after a doubling delay capped at 30 s (`supervisor.backoff`): both, the
# delay's jitter, and a margin.
RECONNECT_SECONDS = 60.0


# The gateway's answers while a supervisor reconnects: no live session (`phases.not_servable`),
# or one on a replica presumed dead (`forwarding.Forwarder.target`); each says to retry.
_RECONNECTING = {
    grpc.StatusCode.FAILED_PRECONDITION: "(its supervisor is reconnecting)",
    grpc.StatusCode.UNAVAILABLE: "its supervisor reconnects to another replica",
}


async def exec_once_connected(stub: Stub, metadata: Any, name: str, command: Sequence[str]) -> tuple[int, bytes]:
    """`exec_via`, retried while the gateway answers that the sandbox's supervisor is
    reconnecting (a sandbox stays Ready meanwhile, so its phase does not say when to exec)."""
    try:
        async with asyncio.timeout(RECONNECT_SECONDS):
            while True:
                try:
                    return await exec_via(stub, metadata, name, command)
                except grpc.aio.AioRpcError as exc:
                    said = _RECONNECTING.get(exc.code())
                    if said is None or said not in (exc.details() or ""):
                        raise
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"{name}: its supervisor did not reconnect in {RECONNECT_SECONDS}s") from None


async def wait_all(
    stub: Stub, metadata: Any, names: Sequence[str], ready: Any, timeout: float
) -> dict[str, pb.Sandbox]:
    """Poll one replica's list until every named sandbox satisfies `ready` (fails naming the rest)."""
    last: dict[str, pb.Sandbox] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=metadata)
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
                    continue
                last = {s.name: s for s in listed.sandboxes}
                if all(n in last and ready(last[n]) for n in names):
                    return last
                await asyncio.sleep(0.1)  # a list is the one view of all sandboxes at once
    except TimeoutError:
        missing = [n for n in names if n not in last or not ready(last[n])]
        shown = [f"{n}: {last[n].status if n in last else 'absent'}" for n in missing[:5]]
        raise AssertionError(f"{len(missing)} sandboxes not there in {timeout}s:\n" + "\n".join(shown)) from None


async def check_nothing_doubled_or_orphaned(admin: kc.KubeClient, sandboxes: dict[str, pb.Sandbox]) -> None:
    """Every claim and cold Sandbox has exactly one record; no pod serves two sandboxes; each warm
    sandbox runs on the pod its claim was bound to."""
    by_id = {s.id: s for s in sandboxes.values()}
    instances = [s.status.instance_id for s in sandboxes.values() if s.status.instance_id]
    assert len(instances) == len(set(instances)), "a pod was activated for two sandboxes"
    claims = (await admin.list_objects(kc.CLAIMS, NAMESPACE))["items"]
    objects = (await admin.list_objects(kc.SANDBOXES, NAMESPACE))["items"]
    pods = {p["metadata"]["name"]: p for p in (await admin.list_objects(kc.PODS, NAMESPACE))["items"]}
    ids = [c["metadata"]["labels"].get(labels.SANDBOX_ID) for c in claims]
    ids += [o["metadata"].get("labels", {}).get(labels.SANDBOX_ID) for o in objects]
    ours = [i for i in ids if i]
    assert len(ours) == len(set(ours)), "one sandbox id has two backend objects"
    assert set(ours) <= set(by_id), f"orphaned backend objects: {set(ours) - set(by_id)}"
    for claim in claims:
        record = by_id[claim["metadata"]["labels"][labels.SANDBOX_ID]]
        bound = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
        if record.status.phase == pb.SANDBOX_PHASE_READY:
            assert bound, f"{record.name} is Ready but its claim is not bound"
            pod = next(p for p in pods.values() if p["metadata"].get("ownerReferences", [{}])[0].get("name") == bound)
            assert pod["metadata"]["uid"] == record.status.instance_id, f"{record.name} runs on another pod"


def survivors(replicas: ReplicaSet) -> list[Replica]:
    return [r for r in replicas.replicas if r.alive]
