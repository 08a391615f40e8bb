"""The Helm chart installed on kubesim as a user would, with no validation flags: `kubesim serve
--rbac` → `helm install` with profiles on → `kubectl rollout status` → the gateway runs as a pod
with its in-cluster credentials under exactly the chart's RBAC → `kubectl apply` of the example
profiles → the warmshell CLI, pointed at the Service's address with the token from the chart's
Secret, creates a warm and a cold sandbox and execs in them → `helm upgrade` rolls the gateway and
the sandboxes come back Ready (their supervisors reconnect through the Service) → `helm uninstall`
leaves nothing the chart does not document keeping."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import warmshell_executable
from tests.integration.kubesim_api.conftest import kubectl_binary
from tests.unit.chart.rendering import helm_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "warmshell"
NS = "warmshell"
STARTUP_SECONDS = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="pods with their own mount and network namespaces need root"),
]


@dataclass
class Cluster:
    """`kubesim serve --rbac` and the tools pointed at it."""

    root: Path
    kubeconfig: Path
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        return os.environ | {"KUBECONFIG": str(self.kubeconfig), "HOME": str(self.root / "home")}

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, env=self.env(), cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check:
            assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([kubectl_binary(), *args], check=check)

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([helm_binary(), *args], timeout=180)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def log(self) -> str:
        return (self.root / "kubesim.log").read_text(errors="replace")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    (tmp_path / "home").mkdir()
    kubeconfig = tmp_path / "kubeconfig.yaml"
    env = os.environ | {"KUBESIM_TIMING": "fast"}
    env.pop("KUBESIM_IMAGE_MAP", None)  # kubesim's own image map: the gateway image as it ships
    with (tmp_path / "kubesim.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kubesim.cli", "serve", "--rbac", "--kubeconfig", str(kubeconfig)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    served = Cluster(tmp_path, kubeconfig, process)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert process.poll() is None, served.log()
            assert time.monotonic() < deadline, served.log()
            if kubeconfig.exists():
                found = served.kubectl("get", "crd", "sandboxwarmpools.extensions.agents.x-k8s.io", check=False)
                if found.returncode == 0:
                    break
            time.sleep(0.2)
        yield served
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait(what: str, probe: Any, within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def test_chart_installs_serves_upgrades_and_uninstalls(cluster: Cluster) -> None:
    values = ("warmPooling.profiles.enabled=true", "egress.enabled=true", "egress.requestsMayWiden=true")
    installed = cluster.helm(
        "install", "warmshell", str(CHART), "-n", NS, "--create-namespace", *(f"--set={v}" for v in values)
    )
    assert "STATUS: deployed" in installed.stdout
    rolled = cluster.kubectl("-n", NS, "rollout", "status", "deploy/warmshell", "--timeout=90s")
    assert 'deployment "warmshell" successfully rolled out' in rolled.stdout

    # The gateway is a pod of the Deployment, running as the chart's ServiceAccount with its token mounted.
    (gateway,) = cluster.json("-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=gateway")["items"]
    assert gateway["spec"]["serviceAccountName"] == "warmshell"
    assert any(v["name"].startswith("kube-api-access-") for v in gateway["spec"]["volumes"])
    assert gateway["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    table = cluster.kubectl("-n", NS, "get", "deploy,rs,pods,svc,endpointslices", "-o", "wide").stdout
    for header in ("UP-TO-DATE", "DESIRED", "NOMINATED NODE", "CLUSTER-IP", "ADDRESSTYPE"):
        assert header in table

    applied = cluster.kubectl("apply", "-n", NS, "-f", "examples/kubernetes/")
    assert "configmap/warm-pool-default created" in applied.stdout
    service = cluster.json("-n", NS, "get", "svc", "warmshell")
    address = f"{service['spec']['clusterIP']}:7443"
    secret = cluster.json("-n", NS, "get", "secret", "warmshell-api-token")
    token = base64.b64decode(secret["data"]["api-token"]).decode()
    cli_env = cluster.env() | {"WARMSHELL_GATEWAY": address, "WARMSHELL_API_TOKEN": token}

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [warmshell_executable(), *args], env=cli_env, capture_output=True, text=True, timeout=90, check=False
        )
        if check:
            assert done.returncode == 0, (
                f"warmshell {' '.join(args)}:\n{done.stdout}\n{done.stderr}\n{cluster.log()[-3000:]}"
            )
        return done

    # The profile reconciler (RBAC: the chart's Role) turned the ConfigMaps into warm pools.
    _wait("the default warm pool", lambda: "2/2/2" in cli("pool", "list").stdout, within=60)
    cli("sandbox", "create", "--name", "warm")
    cli("sandbox", "create", "--name", "cold", "--cpu", "300m")
    listed = cli("sandbox", "list").stdout
    assert any(line.split()[:4] == ["warm", "default", "Ready", "warm"] for line in listed.splitlines()), listed
    assert any(line.split()[:4] == ["cold", "default", "Ready", "cold"] for line in listed.splitlines()), listed
    assert cli("sandbox", "exec", "warm", "--", "sh", "-c", "echo hi from $(pwd)").stdout == "hi from /workspace\n"
    assert cli("sandbox", "exec", "cold", "--", "sh", "-c", "echo cold").stdout == "cold\n"
    _egress_through_the_chart(cluster, cli)

    # A changed value rolls the gateway (config checksum); the sandboxes survive it.
    before = gateway["metadata"]["name"]
    cluster.helm("upgrade", "warmshell", str(CHART), "-n", NS, "--reuse-values", "--set", "gateway.logLevel=DEBUG")
    cluster.kubectl("-n", NS, "rollout", "status", "deploy/warmshell", "--timeout=90s")
    (after,) = cluster.json("-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=gateway")["items"]
    assert after["metadata"]["name"] != before

    def ready_again() -> bool:
        rows = [line.split() for line in cli("sandbox", "list").stdout.splitlines()[1:]]
        return {r[0]: r[2] for r in rows} == {"cold": "Ready", "warm": "Ready"}

    _wait("both sandboxes Ready after the upgrade", ready_again, within=60)
    assert cli("sandbox", "exec", "warm", "--", "sh", "-c", "echo again").stdout == "again\n"
    cli("sandbox", "delete", "warm")
    cli("sandbox", "delete", "cold")

    cluster.helm("uninstall", "warmshell", "-n", NS, "--wait")
    # What the chart documents: everything it created goes (keys, PVC included); sandboxes and the
    # pools the profile reconciler generated are not Helm's, and the example ConfigMaps are ours.
    leftover = cluster.json(
        "-n", NS, "get", "deploy,rs,svc,endpointslices,secrets,pvc,serviceaccounts,roles,rolebindings,leases,netpol"
    )["items"]
    names = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in leftover)
    assert names == ["ServiceAccount/default"], names
    cluster_wide = cluster.json("get", "clusterroles,clusterrolebindings")["items"]
    assert not [o for o in cluster_wide if "warmshell" in o["metadata"]["name"]]


def _egress_through_the_chart(cluster: Cluster, cli: Any) -> None:
    """A pod's workload reaches the proxy in the gateway pod through the `warmshell-egress`
    Service, with the credential its activation carried; a host its policy does not allow is
    refused there (before any lookup: kubesim's pods reach nothing beyond the cluster) and listed
    by `sandbox egress`. The NetworkPolicy is stored (kubesim does not enforce it)."""
    policy = cluster.json("-n", NS, "get", "networkpolicy", "warmshell-sandboxes")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"warmshell.dev/managed-by": "warmshell"}}
    assert cluster.json("-n", NS, "get", "svc", "warmshell-egress")["spec"]["ports"][0]["port"] == 3128
    cli("sandbox", "create", "--name", "net", "--allow-net", "allowed.example:80")
    proxy = cli("sandbox", "exec", "net", "--", "sh", "-c", 'printf %s "$HTTPS_PROXY"').stdout
    assert proxy.startswith("http://")
    assert proxy.endswith("@warmshell-egress.warmshell.svc.cluster.local:3128")
    fetch = "curl -sS -o /dev/null -w '%{http_code}' http://denied.example/"
    assert cli("sandbox", "exec", "net", "--", "sh", "-c", fetch).stdout == "403"
    listed = json.loads(cli("sandbox", "egress", "net", "-o", "json").stdout)
    assert [(d["host"], d["allowed"]) for d in listed["decisions"]] == [("denied.example", False)], listed
    cli("sandbox", "delete", "net")
