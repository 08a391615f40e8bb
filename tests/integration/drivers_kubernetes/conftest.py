"""Fixtures: a kubesim cluster (API server, agent-sandbox controllers, a kubelet running pods as
local processes) whose warmshell image runs the real supervisor, and the driver or a whole gateway
pointed at it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import RunningCluster, running_cluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.core.config import KubernetesDriverConfig, StatePaths
from warmshell.drivers.kubernetes import KubernetesDriver
from warmshell.drivers.local.runtime.agent.installing import BUILT_AGENT

NAMESPACE = "warmshell"
SERVICE_ACCOUNT = "warmshell-sandbox"
IMAGE = "ghcr.io/warmshell/warmshell:test"
BROKEN_IMAGE = "example.com/broken:1"
SHIM = str(Path(__file__).with_name("podshim.py"))
# The project image: `warmshell` (the supervisor) and `warmshell-agent` (the init container's
# `--install`); the workload container's command (the agent) runs as it is. As root kubesim gives
# every container its mount namespace (volumes at their mountPath) and PID namespace, and forks
# `python -m warmshell` from a server that has the supervisor imported, as its default rule does;
# without root the pod shim makes the mount namespace. The shim costs each container two more
# process starts (itself and bwrap) and the supervisor its imports: the replica tests start about
# 4 pods a second.
WARMSHELL_IMAGE: dict[str, Any] = (
    {
        "entrypoint": [sys.executable, "-m", "warmshell", "supervisor"],
        "programs": {"warmshell": [sys.executable, "-m", "warmshell"], "warmshell-agent": [str(BUILT_AGENT)]},
        "preload": ["warmshell.supervisor.main", "warmshell.drivers.local.runtime.agent.installing"],
    }
    if os.geteuid() == 0
    else {
        "entrypoint": [sys.executable, SHIM],
        "programs": {"warmshell": [sys.executable, SHIM], "warmshell-agent": [sys.executable, SHIM, "--agent"]},
    }
)
IMAGES: dict[str, Any] = {
    "ghcr.io/warmshell/*": WARMSHELL_IMAGE,
    # An image whose container dies at once.
    "example.com/broken:*": {"entrypoint": ["sh", "-c", "echo boom >&2; exit 3"], "overrideCommand": True},
}

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the pod shim needs bubblewrap")


@pytest.fixture
async def cluster() -> AsyncIterator[RunningCluster]:
    async with running_cluster(image_map=IMAGES) as running:
        admin = running.client()
        try:
            await admin.create(
                kc.NAMESPACES, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            )
            await admin.create(
                kc.SERVICEACCOUNTS,
                NAMESPACE,
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}},
            )
        finally:
            await admin.aclose()
        yield running
        # Stop pods the way a cluster does (graceful deletion) rather than by tearing the kubelet
        # down while a container may still be starting.
        admin = running.client()
        try:
            await delete_all_and_wait(admin)
        finally:
            await admin.aclose()


def container_pid(cluster: RunningCluster, pod: dict[str, Any], container: str) -> int:
    """The host pid of PID 1 of `pod`'s `container` (it cannot tell its own: its PID namespace),
    from the kubelet, which holds it; under the pod shim, the process bwrap runs."""
    assert cluster.components.kubelet is not None
    pid = cluster.components.kubelet._workers[pod["metadata"]["uid"]].procs[container].pid
    while Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap":
        (pid,) = map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    return pid


async def delete_all_and_wait(admin: kc.KubeClient, timeout: float = 20.0) -> None:
    """Let every pod get past starting, delete every Sandbox, and wait until no pod is left.

    kubesim's kubelet can orphan a container process when its pod is deleted while the process
    is being spawned, so pods are deleted only once they have started (or given up). Warm pools go
    before the Sandboxes (a live pool would refill the members deleted here), with their claims."""
    with contextlib.suppress(TimeoutError):
        await _watch_pods(admin, lambda pods: all(phase != "Pending" for phase in pods.values()), timeout)
    for resource in (kc.POOLS, kc.CLAIMS):
        with contextlib.suppress(kc.ApiError):  # also: the extension CRDs are not installed
            for item in (await admin.list_objects(resource, NAMESPACE)).get("items") or []:
                with contextlib.suppress(kc.ApiError):
                    await admin.delete(resource, NAMESPACE, item["metadata"]["name"])
    for sandbox in (await admin.list_objects(kc.SANDBOXES, NAMESPACE)).get("items") or []:
        with contextlib.suppress(kc.ApiError):
            await admin.delete(kc.SANDBOXES, NAMESPACE, sandbox["metadata"]["name"])
    await _watch_pods(admin, lambda pods: not pods, timeout)


async def _watch_pods(admin: kc.KubeClient, done: Callable[[dict[str, str]], bool], timeout: float) -> None:
    """Follow the namespace's pods (name -> phase) on a watch until `done` holds."""
    async with asyncio.timeout(timeout):
        while True:
            listed = await admin.list_objects(kc.PODS, NAMESPACE)
            pods = {p["metadata"]["name"]: _phase(p) for p in listed.get("items") or []}
            if done(pods):
                return
            version = listed["metadata"]["resourceVersion"]
            async for event in admin.watch(kc.PODS, NAMESPACE, resource_version=version, timeout_seconds=10):
                pod = event.get("object") or {}
                name = (pod.get("metadata") or {}).get("name")
                if event.get("type") == "DELETED":
                    pods.pop(name, None)
                elif event.get("type") in ("ADDED", "MODIFIED"):
                    pods[name] = _phase(pod)
                if done(pods):
                    return


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


@pytest.fixture
async def admin(cluster: RunningCluster) -> AsyncIterator[kc.KubeClient]:
    client = cluster.client()
    try:
        yield client
    finally:
        await client.aclose()


def driver_config(cluster: RunningCluster, state: Path, **overrides: Any) -> KubernetesDriverConfig:
    """The driver's settings for `cluster`, with pods reaching the gateway state's supervisor socket."""
    settings: dict[str, Any] = {
        "kubeconfig": cluster.kubeconfig,
        "namespace": NAMESPACE,
        "gateway_address": f"unix://{StatePaths(state).supervisor_socket}",
        "image": IMAGE,
        "api_timeout_seconds": 5.0,
        "retry_delays_seconds": [0.01, 0.05, 0.1],
        "termination_grace_seconds": 1,
    }
    return KubernetesDriverConfig(**(settings | overrides))


@pytest.fixture
async def driver(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[KubernetesDriver]:
    state = tmp_path / "state"
    async with KubernetesDriver(driver_config(cluster, state), StatePaths(state)) as running:
        yield running


def gateway_settings(cluster: RunningCluster, state: Path) -> dict[str, Any]:
    """Overrides for `running_gateway`: the Kubernetes driver on `cluster`, quick reconciles."""
    settings = driver_config(cluster, state).model_dump()
    return {
        "driver": "kubernetes",
        "reconcile_interval_seconds": 0.5,
        **{f"kubernetes.{k}": v for k, v in settings.items()},
    }


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state)) as running:
        yield running
