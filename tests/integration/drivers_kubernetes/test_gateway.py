"""The whole path on kubesim: a real gateway with the Kubernetes driver, supervisors started by the
kubelet in agent-sandbox pods, registering with their projected tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb

from .conftest import BROKEN_IMAGE, NAMESPACE, gateway_settings

USER = "kubesim-user"
WRITES = ("create", "update", "patch", "delete")
REVIEWS = "tokenreviews.authentication.k8s.io"
SANDBOXES = "sandboxes.agents.x-k8s.io"


def api_writes(cluster: RunningCluster) -> int:
    """Writes by the gateway's user; a TokenReview is a POST that stores nothing."""
    rows = cluster.server.log.counters.items()
    return sum(n for (user, verb, resource), n in rows if user == USER and verb in WRITES and resource != REVIEWS)


async def test_create_ready_exec_delete(gw: RunningGateway, cluster: RunningCluster, admin: kc.KubeClient) -> None:
    writes_before = api_writes(cluster)
    await gw.create(name="one", spec=pb.SandboxSpec(environment={"GREETING": "hello"}))
    ready = await gw.wait_ready("one", timeout=30)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    pod = await admin.get(kc.PODS, NAMESPACE, "default--one")
    assert ready.status.instance_id == pod["metadata"]["uid"]
    timeline = ready.status.timeline
    assert timeline.requested_us <= timeline.backend_created_us <= timeline.registered_us <= timeline.ready_us
    assert api_writes(cluster) - writes_before == 1  # the Sandbox, nothing else
    code, out, _ = await gw.exec("one", ["sh", "-c", 'echo "$GREETING from $(pwd)"'])
    assert (code, out) == (0, b"hello from /workspace\n")
    await gw.delete("one")
    sandboxes = await admin.list_objects(kc.SANDBOXES, NAMESPACE)
    assert sandboxes["items"] == []


async def test_a_pod_whose_container_fails_ends_in_error(gw: RunningGateway) -> None:
    await gw.create(name="bad", spec=pb.SandboxSpec(image=BROKEN_IMAGE))
    failed = await gw.wait_ready("bad", timeout=30)
    assert failed.status.phase == pb.SANDBOX_PHASE_ERROR
    reasons = {c.type: c for c in failed.status.conditions}
    assert reasons["Ready"].reason == "BackendFailed"
    assert "exited with code 3" in reasons["Ready"].message


async def test_a_gateway_restart_loses_nothing(cluster: RunningCluster, tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state)) as first:
        await first.create(name="keep")
        before = await first.wait_ready("keep", timeout=30)
        await first.stop()
    async with running_gateway(state, **gateway_settings(cluster, state)) as second:
        # The same pod's supervisor reconnects to the new gateway; its sandbox is Ready again.
        after = await second.wait_for("keep", lambda s: s.status.phase == pb.SANDBOX_PHASE_READY, timeout=30)
        assert after.id == before.id
        assert after.status.instance_id == before.status.instance_id


async def test_exec_output_after_a_gateway_restart(cluster: RunningCluster, tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state)) as first:
        await first.create(name="keep")
        await first.wait_ready("keep", timeout=30)
        await first.stop()
    async with running_gateway(state, **gateway_settings(cluster, state)) as second:
        await second.wait_for("keep", lambda s: s.status.phase == pb.SANDBOX_PHASE_READY, timeout=30)
        # Bounded: a message lost across the reconnect would leave the exec waiting forever.
        async with asyncio.timeout(10):
            code, out, _ = await second.exec("keep", ["echo", "still here"])
        assert (code, out) == (0, b"still here\n")


async def test_an_unsettled_create_keeps_its_record_until_the_orphan_grace(
    gw: RunningGateway, cluster: RunningCluster
) -> None:
    cluster.server.faults.fail_next(100, code=500, resource=SANDBOXES, user=USER)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await gw.create(name="limbo")
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    kept = await gw.get("limbo")
    assert kept.status.phase == pb.SANDBOX_PHASE_PROVISIONING
    cluster.server.faults.clear()
    # No Sandbox appeared: after the grace period the reconciler re-checks and settles it.
    settled = await gw.wait_for("limbo", lambda s: s.status.phase == pb.SANDBOX_PHASE_ERROR, timeout=30)
    assert {c.reason for c in settled.status.conditions} >= {"BackendVanished"}
