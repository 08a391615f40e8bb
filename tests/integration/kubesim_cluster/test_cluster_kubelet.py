"""The kubelet runs pod containers as real processes with env, downward API, tokens and restarts."""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import Awaitable, Callable

import pytest
from ksc_helpers import NS, get_or_none, wait_for, wait_gone

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc


def pod(name: str, script: str, *, restart: str = "Always", **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "PLAIN", "value": "x-$(POD_NAME)"},
                    ],
                    **spec,
                }
            ],
        },
    }


async def phase(api: kc.KubeClient, name: str) -> str | None:
    obj = await get_or_none(api, kc.PODS, name)
    return (obj or {}).get("status", {}).get("phase")


def pod_dir(cluster: RunningCluster, uid: str) -> pathlib.Path:
    assert cluster.pod_root is not None
    (match,) = [p for p in cluster.pod_root.iterdir() if p.name.endswith(uid[:8])]
    return match


async def test_env_downward_api_and_lifecycle(cluster: RunningCluster, api: kc.KubeClient) -> None:
    script = 'echo "$POD_NAME $POD_NS $POD_UID $POD_IP $PLAIN" > "$KUBESIM_POD_ROOT/out"; exit 0'
    created = await api.create(kc.PODS, NS, pod("envpod", script, restart="Never"))
    await wait_for(lambda: phase(api, "envpod"), lambda p: p == "Succeeded", what="Succeeded")
    done = await api.get(kc.PODS, NS, "envpod")
    uid = created["metadata"]["uid"]
    out = (pod_dir(cluster, uid) / "out").read_text().split()
    assert out == ["envpod", NS, uid, done["status"]["podIP"], "x-envpod"]
    (cs,) = done["status"]["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 0
    assert cs["state"]["terminated"]["reason"] == "Completed"
    assert done["spec"]["nodeName"].startswith("kubesim-node-")


async def test_failure_with_never_fails_the_pod(cluster: RunningCluster, api: kc.KubeClient) -> None:
    await api.create(kc.PODS, NS, pod("bad", "exit 3", restart="Never"))
    await wait_for(lambda: phase(api, "bad"), lambda p: p == "Failed", what="Failed")
    (cs,) = (await api.get(kc.PODS, NS, "bad"))["status"]["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 3


async def test_restart_policy_on_failure_restarts_in_the_same_pod(cluster: RunningCluster, api: kc.KubeClient) -> None:
    # Fails on the first run, succeeds on the second: a restart is a new process, same pod root.
    script = 'if [ -f "$KUBESIM_POD_ROOT/ran" ]; then exit 0; fi; touch "$KUBESIM_POD_ROOT/ran"; exit 1'
    await api.create(kc.PODS, NS, pod("flaky", script, restart="OnFailure"))
    await wait_for(lambda: phase(api, "flaky"), lambda p: p == "Succeeded", what="Succeeded")
    (cs,) = (await api.get(kc.PODS, NS, "flaky"))["status"]["containerStatuses"]
    assert cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 1


async def test_a_pod_deleted_before_it_was_bound_does_not_break_scheduling(
    cluster: RunningCluster, api: kc.KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binding a pod that was deleted while queued answers 404. That is the pod gone, not a server
    without Binding: the kubelet keeps binding, and the next pod still gets a node."""
    kubelet = cluster.components.kubelet
    assert kubelet is not None
    created = await api.create(kc.PODS, NS, pod("gone", "sleep 30"))
    await api.delete(kc.PODS, NS, "gone", grace_period=0)
    await wait_gone(api, kc.PODS, "gone")
    # The kubelet's cache lags the server (as it did when this broke under load): it still has the pod.
    monkeypatch.setattr(kubelet._pods, "get", lambda _ns, _name: created)
    await kubelet._schedule(created)  # what a queued scheduling decision does once its turn comes
    monkeypatch.undo()
    assert kubelet._bind_subresource
    await api.create(kc.PODS, NS, pod("next", "sleep 30"))
    await wait_for(lambda: phase(api, "next"), lambda p: p == "Running", what="next Running")
    scheduled = await api.get(kc.PODS, NS, "next")
    assert scheduled["spec"]["nodeName"]


async def test_readiness_probe_gates_ready(cluster: RunningCluster, api: kc.KubeClient) -> None:
    probe = {"exec": {"command": ["sh", "-c", 'test -f "$KUBESIM_POD_ROOT/ready"']}, "periodSeconds": 0.05}
    created = await api.create(kc.PODS, NS, pod("probed", "sleep 3600", readinessProbe=probe))

    async def ready() -> str | None:
        obj = await get_or_none(api, kc.PODS, "probed")
        conds = {c["type"]: c["status"] for c in (obj or {}).get("status", {}).get("conditions", [])}
        return conds.get("Ready") if (obj or {}).get("status", {}).get("phase") == "Running" else None

    assert await wait_for(ready, lambda r: r == "False", what="running, not ready") == "False"
    (pod_dir(cluster, created["metadata"]["uid"]) / "ready").touch()
    await wait_for(ready, lambda r: r == "True", what="ready")


async def test_graceful_deletion_stops_the_process(cluster: RunningCluster, api: kc.KubeClient) -> None:
    created = await api.create(kc.PODS, NS, pod("sleeper", 'touch "$KUBESIM_POD_ROOT/up"; exec sleep 3600'))
    uid = created["metadata"]["uid"]
    await wait_for(lambda: phase(api, "sleeper"), lambda p: p == "Running", what="Running")
    directory = pod_dir(cluster, uid)
    await wait_for(lambda: _read(directory / "up"), lambda t: t == "", what="started")
    pids = _pids_of(directory)
    assert pids
    await api.delete(kc.PODS, NS, "sleeper")
    await wait_gone(api, kc.PODS, "sleeper")
    await wait_for(_living(pids), lambda alive: not alive, within=5, what="every process gone")


async def test_projected_token_is_accepted_by_token_review(cluster: RunningCluster, api: kc.KubeClient) -> None:
    body = pod("tok", "sleep 3600", volumeMounts=[{"name": "tok", "mountPath": "/var/run/secrets/tokens"}])
    body["spec"]["volumes"] = [  # type: ignore[index]
        {
            "name": "tok",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": "warmshell-gateway",
                            "expirationSeconds": 600,
                            "path": "token",
                        }
                    }
                ]
            },
        }
    ]
    created = await api.create(kc.PODS, NS, body)
    await wait_for(lambda: phase(api, "tok"), lambda p: p == "Running", what="Running")
    token_file = pod_dir(cluster, created["metadata"]["uid"]) / "var/run/secrets/tokens/token"
    token = token_file.read_text()
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": ["warmshell-gateway"]},
    }
    result = await api.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=review)
    status = result["status"]
    assert status["authenticated"] is True
    assert status["user"]["username"] == f"system:serviceaccount:{NS}:default"
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["tok"]
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-uid"] == [created["metadata"]["uid"]]


async def test_stopping_the_cluster_kills_every_process() -> None:
    from kubesim.cluster import running_cluster

    async with running_cluster() as other:
        client = other.client()
        try:
            await client.create(kc.PODS, NS, pod("p1", 'touch "$KUBESIM_POD_ROOT/up"; exec sleep 3600'))

            async def pids() -> list[int]:
                assert other.pod_root is not None
                return [pid for up in other.pod_root.glob("*/up") for pid in _pids_of(up.parent)]

            found = await wait_for(pids, bool, what="the container's processes")
        finally:
            await client.aclose()
    await wait_for(_living(found), lambda alive: not alive, within=5, what="every process gone")


async def _read(path: pathlib.Path) -> str | None:
    return await asyncio.to_thread(lambda: path.read_text() if path.exists() else None)


def _living(pids: list[int]) -> Callable[[], Awaitable[list[int]]]:
    """Which of ``pids`` still run (killed as their pod ends, they take a moment to be gone)."""

    async def living() -> list[int]:
        return [pid for pid in pids if _alive(pid)]

    return living


def _pids_of(directory: pathlib.Path) -> list[int]:
    """Host pids of the processes of the pod at ``directory`` (each container is PID 1 of its own
    namespace, so it cannot tell its host pid): those whose environment names it as their root."""
    marker = f"KUBESIM_POD_ROOT={directory}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie not yet reaped still "exists"; check its state.
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"
