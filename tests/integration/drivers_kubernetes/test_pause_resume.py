"""Pause and resume on Kubernetes (kubesim) through a real gateway: agent-sandbox's `Suspended`
operating mode. A pause is one write; agent-sandbox deletes the pod and keeps the Sandbox; the
record is Paused and its lifetime stands still. A resume sets the mode back with a new activation
proof; agent-sandbox makes a new pod (same name, new uid) whose supervisor registers and is
activated through the full chain. The old pod's credentials are worthless afterwards. A warm
(claimed) sandbox pauses the same way and its pool refills without it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

import warmshell
from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.drivers.kubernetes.warm import warmpools

from .conftest import NAMESPACE, driver_config, gateway_settings
from .test_attacks import pod_token
from .test_restarts import wait_runs
from .test_warm import SHAPE, wait_idle

Obj = dict[str, Any]


async def pause(gw: RunningGateway, name: str, ttl: int = 0) -> pb.Sandbox:
    paused: pb.Sandbox = await gw.stub.PauseSandbox(
        pb.PauseSandboxRequest(name=name, pause_ttl_seconds=ttl), metadata=gw.metadata
    )
    return paused


async def resume(gw: RunningGateway, name: str) -> pb.Sandbox:
    request = pb.ResumeSandboxRequest(name=name, wait_ready=True, ready_timeout_ms=60_000)
    resumed: pb.Sandbox = await gw.stub.ResumeSandbox(request, metadata=gw.metadata)
    return resumed


async def wait_cluster(admin: kc.KubeClient, check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll the cluster until `check()` (a coroutine function) returns something truthy."""
    async with asyncio.timeout(timeout):
        while not (found := await check()):
            await asyncio.sleep(0.1)
    assert found, what
    return found


def condition(obj: Obj, type_: str) -> Obj:
    return next(c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_)


async def pods_named(admin: kc.KubeClient, name: str) -> list[Obj]:
    pods = (await admin.list_objects(kc.PODS, NAMESPACE)).get("items") or []
    return [p for p in pods if p["metadata"]["name"] == name]


async def suspended(admin: kc.KubeClient, name: str) -> Obj | None:
    """The Sandbox once agent-sandbox reports it suspended (its pod gone)."""
    sandbox = await admin.get(kc.SANDBOXES, NAMESPACE, name)
    done = sandbox["spec"].get("operatingMode") == "Suspended" and condition(sandbox, "Suspended")["status"] == "True"
    return sandbox if done and not await pods_named(admin, name) else None


async def test_a_paused_sandbox_is_a_suspended_sandbox_and_resumes_as_a_new_pod(
    gw: RunningGateway, admin: kc.KubeClient
) -> None:
    command = ["sh", "-c", "echo run >> /workspace/runs; exec sleep 600"]
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(
            name="napper", command=command, ttl_seconds=600, idle_timeout_seconds=300, ready_timeout=60
        )
        before = sb.last_info
        await sb.run(["sh", "-c", "echo hi > /workspace/note"], check=True)
        paused = await sb.pause(pause_ttl_seconds=900)
        assert paused.phase is warmshell.Phase.PAUSED
        assert paused.instance_id == ""
        # The lifetime stands still: the pause TTL instead, the idle timeout off.
        assert paused.lifetime.expires_at is not None
        left = (paused.lifetime.expires_at - datetime.now(UTC)).total_seconds()
        assert (880 < left <= 900, paused.lifetime.idle_timeout_seconds) == (True, 0)
        sandbox = await wait_cluster(admin, lambda: suspended(admin, "default--napper"), "the pod deleted")
        assert condition(sandbox, "Ready")["reason"] == "SandboxSuspended"
        assert "podIPs" not in sandbox["status"]
        # Reconcile passes see the Sandbox without a pod: the record stays Paused, not Error.
        await asyncio.sleep(1.5)
        assert [(i.name, i.phase) for i in await client.list()] == [("napper", warmshell.Phase.PAUSED)]
        with pytest.raises(warmshell.FailedPrecondition):
            await sb.run(["true"])

        resumed = await sb.resume(ready_timeout=60)
        assert resumed.phase is warmshell.Phase.READY
        (pod,) = await pods_named(admin, "default--napper")
        assert resumed.instance_id == pod["metadata"]["uid"] != before.instance_id
        assert (await admin.get(kc.SANDBOXES, NAMESPACE, "default--napper"))["spec"]["operatingMode"] == "Running"
        # A new pod: the command ran again in it; /workspace is the pod's emptyDir, not kept.
        await wait_runs(gw, "napper", b"run\n")
        assert (await sb.run(["test", "-e", "/workspace/note"])).exit_code == 1
        assert resumed.lifetime.idle_timeout_seconds == 300
        assert await sb.delete() is True
    await wait_cluster(admin, lambda: _gone(admin, "default--napper"), "the Sandbox deleted")


async def _gone(admin: kc.KubeClient, name: str, resource: kc.Resource = kc.SANDBOXES) -> bool:
    try:
        await admin.get(resource, NAMESPACE, name)
    except kc.ApiError as exc:
        return exc.not_found
    return False


async def test_the_old_pods_credentials_are_worthless_after_a_resume(
    gw: RunningGateway, admin: kc.KubeClient, cluster: RunningCluster
) -> None:
    """Attack: the pod's projected token and a sandbox token of the paused instance, kept by a
    thief, tried while paused and after the resume. A resumed pod is the same Sandbox with a new
    pod uid; only that new pod is accepted."""
    await gw.create(name="victim", spec=pb.SandboxSpec(environment={"API_KEY": "s3cr3t"}))
    before = await gw.wait_ready("victim", timeout=30)
    old_pod_token = pod_token(cluster, before)
    old_sandbox_token, _ = gw.gateway.parts.issuer.mint(before.id, before.status.instance_id)
    await pause(gw, "victim")
    await wait_cluster(admin, lambda: suspended(admin, "default--victim"), "the pod deleted")
    stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)

    async def attempts() -> list[grpc.StatusCode]:
        codes = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=old_pod_token)).read()
        codes.append(caught.value.code())
        metadata = (("authorization", f"Bearer {old_sandbox_token}"),)

        async def hello() -> Any:
            yield spb.SupervisorMessage(
                hello=spb.SupervisorHello(sandbox_id=before.id, instance_id=before.status.instance_id)
            )

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ConnectSupervisor(hello(), metadata=metadata).read()
        codes.append(caught.value.code())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=metadata)
        codes.append(caught.value.code())
        return codes

    denied = [grpc.StatusCode.PERMISSION_DENIED] * 3
    assert await attempts() == denied
    assert (await gw.get("victim")).status.phase == pb.SANDBOX_PHASE_PAUSED
    after = await resume(gw, "victim")
    assert after.status.phase == pb.SANDBOX_PHASE_READY
    assert after.status.instance_id != before.status.instance_id
    assert await attempts() == denied
    # The new pod's own token is the one accepted: the sandbox kept its session and secrets.
    current = await gw.get("victim")
    assert current.status.instance_id == after.status.instance_id
    assert current.status.phase == pb.SANDBOX_PHASE_READY
    assert await gw.exec("victim", ["sh", "-c", "echo REAL $API_KEY"]) == (0, b"REAL s3cr3t\n", b"")


async def test_a_resume_racing_a_delete_leaves_nothing(gw: RunningGateway, admin: kc.KubeClient) -> None:
    for round_ in range(3):
        name = f"racer{round_}"
        await gw.create(name=name)
        await gw.wait_ready(name, timeout=30)
        await pause(gw, name)
        results = await asyncio.gather(resume(gw, name), gw.delete(name), return_exceptions=True)
        assert not isinstance(results[1], BaseException), results[1]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.get(name)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        await wait_cluster(admin, lambda n=name: _gone(admin, f"default--{n}"), "the Sandbox deleted")
        await wait_cluster(admin, lambda n=name: _no_pod(admin, f"default--{n}"), "no pod left")


async def _no_pod(admin: kc.KubeClient, name: str) -> bool:
    return not await pods_named(admin, name)


async def test_a_gateway_stopped_between_the_write_and_the_record_finds_it_paused(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """The Sandbox says Running while the record says Paused: a resume's write landed and the
    gateway stopped before its record did (or a pause's record landed and its write did not).
    The record is the truth: the next gateway suspends the Sandbox again, the pod that started
    meanwhile is not activated, and a resume then works."""
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state)
    async with running_gateway(state, **settings) as gw:
        await gw.create(name="crashy")
        first = await gw.wait_ready("crashy", timeout=30)
        await pause(gw, "crashy")
        await wait_cluster(admin, lambda: suspended(admin, "default--crashy"), "the pod deleted")
        await gw.stop()
    await admin.patch(kc.SANDBOXES, NAMESPACE, "default--crashy", {"spec": {"operatingMode": "Running"}})
    await wait_cluster(admin, lambda: _running_pod(admin, "default--crashy"), "a pod started again")
    async with running_gateway(state, **settings) as gw:
        await wait_cluster(admin, lambda: suspended(admin, "default--crashy"), "suspended again by the gateway")
        assert (await gw.get("crashy")).status.phase == pb.SANDBOX_PHASE_PAUSED
        after = await resume(gw, "crashy")
        assert after.status.phase == pb.SANDBOX_PHASE_READY
        assert after.status.instance_id not in ("", first.status.instance_id)
        assert await gw.exec("crashy", ["echo", "back"]) == (0, b"back\n", b"")


async def _running_pod(admin: kc.KubeClient, name: str) -> bool:
    return any((p.get("status") or {}).get("phase") == "Running" for p in await pods_named(admin, name))


async def test_a_paused_sandbox_never_resumed_is_deleted_after_its_pause_ttl(
    gw: RunningGateway, admin: kc.KubeClient
) -> None:
    await gw.create(name="forgotten")
    await gw.wait_ready("forgotten", timeout=30)
    await pause(gw, "forgotten", ttl=1)
    await wait_cluster(admin, lambda: _gone(admin, "default--forgotten"), "the Sandbox deleted", timeout=20)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gw.get("forgotten")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_paused_warm_sandbox_leaves_its_pool_and_resumes_through_its_claim(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """Its pool's members hold their /workspace on a claim (`workspace_claim_size`): the claimed
    member's files survive the pause too."""
    state = tmp_path / "state"
    config = driver_config(cluster, state, workspace_claim_size="1Gi")
    template, pool = warmpools.render_pool_pair(config, name="foo", namespace=NAMESPACE, shape=SHAPE, replicas=1)
    await admin.create(kc.TEMPLATES, NAMESPACE, template)
    await admin.create(kc.POOLS, NAMESPACE, pool)
    settings = gateway_settings(cluster, state) | {"kubernetes.workspace_claim_size": "1Gi"}
    async with running_gateway(state, **settings) as gw:
        await wait_idle(gw, "foo", 1)
        await gw.create(name="hot", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        before = await gw.wait_ready("hot", timeout=30)
        assert before.status.allocation == "warm"
        claim = await admin.get(kc.CLAIMS, NAMESPACE, "default--hot")
        member = claim["status"]["sandbox"]["name"]
        assert await gw.exec("hot", ["sh", "-c", "echo kept > /workspace/note"]) == (0, b"", b"")
        await pause(gw, "hot")
        await wait_cluster(admin, lambda: suspended(admin, member), "the member's pod deleted")
        # The pool refills to its size without the paused sandbox, and serves a new create from
        # another member: a suspended one is never handed out again.
        await wait_idle(gw, "foo", 1)
        await gw.create(name="other", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        other = await gw.wait_ready("other", timeout=30)
        assert other.status.allocation == "warm"
        other_claim = await admin.get(kc.CLAIMS, NAMESPACE, "default--other")
        assert other_claim["status"]["sandbox"]["name"] != member
        after = await resume(gw, "hot")
        assert (after.status.phase, after.status.allocation) == (pb.SANDBOX_PHASE_READY, "warm")
        assert after.status.instance_id not in ("", before.status.instance_id)
        assert (await admin.get(kc.CLAIMS, NAMESPACE, "default--hot"))["status"]["sandbox"]["name"] == member
        assert await gw.exec("hot", ["sh", "-c", "echo $FOO; cat /workspace/note"]) == (0, b"bar\nkept\n", b"")
        with contextlib.suppress(grpc.aio.AioRpcError):
            await gw.delete("other")


async def test_a_workspace_on_a_volume_claim_survives_a_pause(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """`kubernetes.workspace_claim_size`: /workspace is a PVC agent-sandbox keeps while the
    Sandbox is suspended, so the resumed pod finds the files; the claim goes with the sandbox."""
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state) | {"kubernetes.workspace_claim_size": "1Gi"}
    async with running_gateway(state, **settings) as gw:
        await gw.create(
            name="keeper", spec=pb.SandboxSpec(command=["sh", "-c", "echo run >> /workspace/runs; exec sleep 600"])
        )
        before = await gw.wait_ready("keeper", timeout=30)
        assert await gw.exec("keeper", ["sh", "-c", "echo kept > /workspace/note"]) == (0, b"", b"")
        await wait_runs(gw, "keeper", b"run\n")  # (paused before its first line ran, it would not count)
        claim = await admin.get(kc.PVCS, NAMESPACE, "workspace-default--keeper")
        await pause(gw, "keeper")
        await wait_cluster(admin, lambda: suspended(admin, "default--keeper"), "the pod deleted")
        after = await resume(gw, "keeper")
        assert after.status.instance_id not in ("", before.status.instance_id)
        await wait_runs(gw, "keeper", b"run\nrun\n")
        assert await gw.exec("keeper", ["cat", "/workspace/note", "/workspace/runs"]) == (0, b"kept\nrun\nrun\n", b"")
        assert (await admin.get(kc.PVCS, NAMESPACE, "workspace-default--keeper"))["metadata"]["uid"] == claim[
            "metadata"
        ]["uid"]
        await gw.delete("keeper")
        await wait_cluster(admin, lambda: _gone(admin, "workspace-default--keeper", kc.PVCS), "the claim deleted")
