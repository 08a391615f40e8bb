"""Secrets and accepted environment on kubesim: a ConfigMap profile with `FOO=bar` baked and
`TASK_*` accepted serves a create with a per-task key and a secret warm; the secret reaches the
workload and execs through the activation alone — no Kubernetes object holds it — and a gateway
restart followed by a killed supervisor re-activates the sandbox with it from the sealed store."""

from __future__ import annotations

import base64
import logging
import shutil
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render
from warmshell.drivers.kubernetes import labels

from .conftest import NAMESPACE
from .test_profiles import apply_profile, kubectl, profile_settings, ready_status
from .test_restarts import kill_supervisor, pod_with_uid, reactivated_after, restarted_and_running, wait_pod

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")

SECRET = "s3cr3t-k8s-5d2a"
PROFILE = """version = 1
workspace = "default"
replicas = 2
[environment]
FOO = "bar"
[activation]
environment = ["TASK_*"]
"""
SHOW = ["sh", "-c", 'echo "$FOO $TASK_ID $API_KEY"']
KINDS = (
    "pods",
    "configmaps",
    "secrets",
    "events",
    "serviceaccounts",
    "leases",
    "sandboxes",
    "sandboxclaims",
    "sandboxtemplates",
    "sandboxwarmpools",
)


def needles() -> list[str]:
    raw = SECRET.encode()
    return [SECRET, base64.b64encode(raw).decode(), base64.b64encode(raw).decode().rstrip("=")]


async def namespace_dump(cluster: RunningCluster) -> str:
    return "".join([await kubectl(cluster, "get", kind, "-n", NAMESPACE, "-o", "yaml") for kind in KINDS])


async def idle_pool(gw: RunningGateway, name: str, count: int) -> pb.Pool:
    def check(response: pb.ListPoolsResponse) -> bool:
        found = pool_named(response, name)
        return found is not None and found.idle >= count

    found = pool_named(await wait_pools(gw, check, timeout=45), name)
    assert found is not None
    return found


async def test_secret_and_accepted_key_go_warm_survive_restarts_and_stay_out_of_kubernetes(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    state = tmp_path / "state"
    settings = {**profile_settings(cluster, state), "log_level": "DEBUG"}
    await apply_profile(admin, "tasks", PROFILE)
    async with running_gateway(state, **settings) as gw:
        generated = (await ready_status(admin, "tasks"))[labels.PROFILE_GENERATED]
        pool = await idle_pool(gw, generated, 2)
        assert list(pool.accepted_environment) == ["TASK_*"]
        template = await admin.get(kc.TEMPLATES, NAMESPACE, generated)
        assert "TASK_ID" not in str(template)

        spec = pb.SandboxSpec(environment={"FOO": "bar", "TASK_ID": "9"}, secrets={"API_KEY": SECRET})
        await gw.create(name="k1", spec=spec)
        before = await gw.wait_ready("k1", timeout=30)
        assert (before.status.phase, before.status.allocation) == (pb.SANDBOX_PHASE_READY, "warm")
        assert list(before.status.injected_environment) == ["TASK_ID"]
        assert dict(before.spec.secrets) == {"API_KEY": "<redacted>"}
        assert await gw.exec("k1", SHOW) == (0, f"bar 9 {SECRET}\n".encode(), b"")

        await gw.create(name="k-cold", spec=pb.SandboxSpec(environment={"FOO": "baz", "TASK_ID": "9"}))
        cold = await gw.wait_ready("k-cold", timeout=30)
        allocated = next(c for c in cold.status.conditions if c.type == "Allocated")
        assert (cold.status.allocation, allocated.reason, allocated.message) == ("cold", "PoolMiss", "NoMatch")
        await gw.stop()

    async with running_gateway(state, **settings) as gw:
        connected = await gw.wait_for("k1", lambda s: s.status.phase == pb.SANDBOX_PHASE_READY, timeout=30)
        pod = await pod_with_uid(admin, connected.status.instance_id)
        kill_supervisor(cluster, pod)
        await wait_pod(admin, pod["metadata"]["name"], restarted_and_running(1))
        await gw.wait_for("k1", reactivated_after(connected), timeout=30)
        # The new supervisor process got the secret from this gateway's activation, which opened
        # it from the sealed store written by the previous gateway.
        assert await gw.exec("k1", SHOW) == (0, f"bar 9 {SECRET}\n".encode(), b"")

        await idle_pool(gw, generated, 1)
        await gw.create(name="k2", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        second = await gw.wait_ready("k2", timeout=30)
        assert second.status.allocation == "warm"
        assert await gw.exec("k2", SHOW) == (0, b"bar  \n", b"")

        dumped = await namespace_dump(cluster)
        assert "SandboxClaim" in dumped
        assert "default--k1" in dumped
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        shown = render.to_json(listed)
        logged = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
        for needle in needles():
            assert needle not in dumped
            assert needle not in shown
            assert needle not in logged
        await gw.delete("k1")
        await gw.delete("k2")
        await gw.delete("k-cold")
