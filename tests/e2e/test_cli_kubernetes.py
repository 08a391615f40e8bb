"""examples/kubernetes/README.md as a user types it, with real processes only: `kubesim serve`
(API server, agent-sandbox controllers, a kubelet running pods as local processes), the real
kubectl, and `warmshell gateway start --config` with the Kubernetes driver and the profile
reconciler on. The example ConfigMaps become warm pools, and the README's creates are served warm
from the pool generated for the matching profile; a shape no profile has starts cold (NoMatch)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import CliGateway, start_gateway
from tests.helpers.kubesim_process import KubesimServe, kubesim_serve
from tests.integration.kubesim_api.conftest import kubectl_binary

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "warmshell"
PROFILE_LABEL = "warmshell.dev/warm-pool-profile=true"
STATUS = "warmshell.dev/warm-pool-status"
GENERATED = "warmshell.dev/warm-pool-generated"
# The README's creates: sandbox name -> (the ConfigMap whose pool serves it, the shape arguments).
CREATES = {
    "plain": ("warm-pool-default", []),
    "foo": ("warm-pool-env-foo", ["--env", "FOO=bar"]),
    "small": ("warm-pool-cpu", ["--cpu", "0.2"]),
    "task": (
        "warm-pool-agent-tasks",
        ["--env", "AGENT=coder", "--env", "TASK_ID=17", "--secret", "API_KEY=s3cr3t"],
    ),
}
POOLS_READY_TIMEOUT_SECONDS = 30.0
LEFTOVER_TIMEOUT_SECONDS = 5.0


@dataclass
class Kubectl:
    """The real kubectl with the kubeconfig kubesim wrote ($KUBECONFIG, as the README exports it)
    and a HOME of its own (its discovery cache)."""

    kubeconfig: Path
    home: Path

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            [kubectl_binary(), *args],
            cwd=REPO,  # the README's paths are relative to the repository root
            env=os.environ | {"KUBECONFIG": str(self.kubeconfig), "HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
        return done.stdout


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KubesimServe]:
    # No skip without bubblewrap: CI installs it, and a silent skip would hide a broken setup.
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required by the pod shim: apt-get install bubblewrap"
    with kubesim_serve(tmp_path / "kubesim") as served:
        yield served
    # Stopping kubesim stopped its kubelet, which kills every pod process: none may be left. Pods
    # carry the gateway's socket path, under tmp_path, in their environment.
    leftovers = _processes_mentioning(str(tmp_path), LEFTOVER_TIMEOUT_SECONDS)
    assert not leftovers, f"processes left after kubesim stopped: {leftovers}"


@pytest.fixture
def kubectl(cluster: KubesimServe, tmp_path: Path) -> Kubectl:
    home = tmp_path / "kubectl-home"
    home.mkdir()
    return Kubectl(cluster.kubeconfig, home)


@pytest.fixture
def gateway(cluster: KubesimServe, kubectl: Kubectl, tmp_path: Path) -> Iterator[CliGateway]:
    """The README's kubesim setup: the namespace and ServiceAccount, then a gateway from a config
    file with the Kubernetes driver and (examples/kubernetes/README.md) the profile reconciler on."""
    kubectl("create", "namespace", NAMESPACE)
    kubectl("-n", NAMESPACE, "create", "serviceaccount", "warmshell-sandbox")
    state = tmp_path / "state"
    config = tmp_path / "ws-k8s.toml"
    config.write_text(
        "\n".join(
            [
                'driver = "kubernetes"',
                "[kubernetes]",
                'credentials = "kubeconfig"',
                f"kubeconfig = {json.dumps(str(cluster.kubeconfig))}",
                f"namespace = {json.dumps(NAMESPACE)}",
                f"gateway_address = {json.dumps(f'unix://{state}/supervisor.sock')}",
                "[kubernetes.warm_pooling.profiles]",
                "enabled = true",
                "",
            ]
        )
    )
    running = start_gateway(state, "--config", str(config))
    try:
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


def test_example_profiles_serve_the_readme_creates_warm(
    gateway: CliGateway, kubectl: Kubectl, cluster: KubesimServe
) -> None:
    applied = kubectl("apply", "-n", NAMESPACE, "-f", "examples/kubernetes/")
    assert sorted(applied.split()) == sorted(
        [
            "configmap/warm-pool-agent-tasks",
            "configmap/warm-pool-cpu",
            "configmap/warm-pool-default",
            "configmap/warm-pool-env-foo",
            *["created"] * 4,
        ]
    ), applied
    generated = _wait_for_warm_pools(gateway, kubectl, cluster)

    # What the README shows a user: each ConfigMap Ready with its pool, the generated pairs.
    columns = kubectl(
        "-n",
        NAMESPACE,
        "get",
        "configmap",
        "-l",
        PROFILE_LABEL,
        "-o",
        "custom-columns=NAME:.metadata.name,STATUS:.metadata.annotations.warmshell\\.dev/warm-pool-status,"
        "POOL:.metadata.annotations.warmshell\\.dev/warm-pool-generated",
    )
    rows = [line.split() for line in columns.splitlines()]
    assert rows[0] == ["NAME", "STATUS", "POOL"]
    assert sorted(rows[1:]) == sorted([name, "Ready", pool] for name, pool in generated.items())
    pairs = kubectl("-n", NAMESPACE, "get", "sandboxwarmpools,sandboxtemplates", "-o", "name")
    for pool in generated.values():
        assert f"sandboxwarmpool.extensions.agents.x-k8s.io/{pool}" in pairs.split(), pairs
        assert f"sandboxtemplate.extensions.agents.x-k8s.io/{pool}" in pairs.split(), pairs

    for name, (configmap, shape) in CREATES.items():
        sandbox = _create(gateway, name, *shape)
        assert sandbox["status"]["phase"] == "SANDBOX_PHASE_READY", sandbox
        assert sandbox["status"]["allocation"] == "warm", (name, sandbox, gateway.log())
        assert sandbox["status"]["pool"] == generated[configmap], (name, sandbox)

    echoed = gateway.run("sandbox", "exec", "foo", "--", "sh", "-c", "echo $FOO")
    assert (echoed.returncode, echoed.stdout, echoed.stderr) == (0, "bar\n", "")
    got = gateway.run("sandbox", "get", "foo")
    assert got.returncode == 0, got.stderr
    lines = [" ".join(line.split()) for line in got.stdout.splitlines()]
    assert any(line.startswith("Allocation warm (pool ") for line in lines), got.stdout
    assert f"Allocated True PoolHit {generated['warm-pool-env-foo']}" in lines, got.stdout

    # The accepted key and the secret reached the warm sandbox; `get` names them, shows no value.
    echoed = gateway.run("sandbox", "exec", "task", "--", "sh", "-c", 'echo "$AGENT $TASK_ID $API_KEY"')
    assert (echoed.returncode, echoed.stdout, echoed.stderr) == (0, "coder 17 s3cr3t\n", "")
    got = gateway.run("sandbox", "get", "task")
    lines = [" ".join(line.split()) for line in got.stdout.splitlines()]
    assert "Injected TASK_ID" in lines, got.stdout
    assert "Secrets API_KEY" in lines, got.stdout
    assert "s3cr3t" not in got.stdout + gateway.run("sandbox", "list", "-o", "json").stdout

    # A shape no profile has (environment and cpu together) still works: cold, and says why.
    cold = _create(gateway, "both", "--env", "FOO=bar", "--cpu", "0.2")
    assert cold["status"]["phase"] == "SANDBOX_PHASE_READY", cold
    assert cold["status"]["allocation"] == "cold", cold
    got_json = gateway.run("sandbox", "get", "both", "-o", "json")
    assert got_json.returncode == 0, got_json.stderr
    allocated = [c for c in json.loads(got_json.stdout)["status"]["conditions"] if c["type"] == "Allocated"]
    assert [(c["status"], c["reason"], c["message"]) for c in allocated] == [("True", "PoolMiss", "NoMatch")]

    # `warmshell pool list`: one hit on each pool, the miss counted by reason.
    listed = gateway.run("pool", "list")
    assert listed.returncode == 0, listed.stderr
    header, *table = listed.stdout.splitlines()
    assert header.split() == [
        "NAME", "WORKSPACE", "FINGERPRINT", "DESIRED/READY/IDLE", "HITS", "MISSES", "HIT", "RATE", "ACCEPTS"
    ]  # fmt: skip
    by_name = {row.split()[0]: row.split() for row in table[:-1]}
    assert set(by_name) == set(generated.values()), listed.stdout
    for cells in by_name.values():
        assert cells[1] == "default"
        assert cells[4:7] == ["1", "0", "100.0%"], listed.stdout
    assert by_name[generated["warm-pool-agent-tasks"]][7] == "RUN_*,TASK_ID", listed.stdout
    assert table[-1] == "Misses by reason: NoMatch 1", listed.stdout

    for name in [*CREATES, "both"]:
        deleted = gateway.run("sandbox", "delete", name)
        assert deleted.returncode == 0, deleted.stderr
    remaining = gateway.run("sandbox", "list", "-o", "json")
    assert remaining.returncode == 0, remaining.stderr
    assert json.loads(remaining.stdout)["sandboxes"] == []
    # The pools' members still run, found the way the cluster fixture looks for leftovers.
    assert _processes_mentioning(str(gateway.state_dir), timeout=0), "no pod process found by its environment"


def _create(gateway: CliGateway, name: str, *shape: str) -> dict[str, Any]:
    created = gateway.run("sandbox", "create", "--name", name, *shape, "-o", "json")
    assert created.returncode == 0, f"create {name} exited {created.returncode}: {created.stderr}\n{gateway.log()}"
    sandbox: dict[str, Any] = json.loads(created.stdout)
    return sandbox


def _wait_for_warm_pools(gateway: CliGateway, kubectl: Kubectl, cluster: KubesimServe) -> dict[str, str]:
    """Until every profile ConfigMap is Ready and `warmshell pool list` shows its generated pool
    with an idle member; returns ConfigMap name -> generated pool name."""
    # Each round is a kubectl and a warmshell round trip, so the loop re-checks without sleeping;
    # the deadline only bounds pools that never fill.
    deadline = time.monotonic() + POOLS_READY_TIMEOUT_SECONDS
    expected = {configmap for configmap, _ in CREATES.values()}
    while True:
        configmaps = json.loads(kubectl("-n", NAMESPACE, "get", "configmap", "-l", PROFILE_LABEL, "-o", "json"))
        annotations = {c["metadata"]["name"]: c["metadata"].get("annotations") or {} for c in configmaps["items"]}
        generated = {name: a.get(GENERATED, "") for name, a in annotations.items() if a.get(STATUS) == "Ready"}
        listed = gateway.run("pool", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        idle = {pool["name"]: pool["idle"] for pool in json.loads(listed.stdout)["pools"]}
        if set(generated) == expected and all(idle.get(pool, 0) >= 1 for pool in generated.values()):
            assert len(idle) == len(expected), listed.stdout  # no pools other than the profiles'
            return generated
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the example profiles did not become warm pools with an idle member in "
                f"{POOLS_READY_TIMEOUT_SECONDS}s\n--- ConfigMap annotations ---\n{json.dumps(annotations, indent=2)}"
                f"\n--- pool list ---\n{listed.stdout}\n--- gateway log ---\n{gateway.log()[-6000:]}"
                f"\n--- kubesim log ---\n{cluster.log()[-4000:]}"
            )


def _processes_mentioning(marker: str, timeout: float) -> list[str]:
    """Command lines of processes (other than this one) with `marker` in their environment or
    command line, once none is left or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if marker.encode() in environ or marker.encode() in cmdline:
                command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"{entry.name}: {command}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


TYPO_PROFILE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: warm-pool-typo
  labels:
    warmshell.dev/warm-pool-profile: "true"
data:
  warm-pool.toml: |
    version = 1
    workspace = "default"
    replicsa = 2
"""


def test_pool_list_shows_an_invalid_profile_configmap(gateway: CliGateway, kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(TYPO_PROFILE)
    kubectl("apply", "--validate=false", "-n", NAMESPACE, "-f", str(manifest))
    deadline = time.monotonic() + POOLS_READY_TIMEOUT_SECONDS
    while True:
        listed = gateway.run("pool", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        typo = [p for p in json.loads(listed.stdout)["pools"] if p["name"] == "warm-pool-typo"]
        if typo:
            break
        assert time.monotonic() < deadline, f"the invalid profile never showed in pool list:\n{gateway.log()}"
        time.sleep(0.2)
    [condition] = typo[0]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("ProfileValid", "False", "InvalidProfile")
    assert condition["message"].startswith(f"configmap {NAMESPACE}/warm-pool-typo:3: replicsa: unknown key")
    assert typo[0]["source"] == f"configmap {NAMESPACE}/warm-pool-typo"
    human = gateway.run("pool", "list")
    assert f"warm-pool-typo: InvalidProfile: configmap {NAMESPACE}/warm-pool-typo:3: replicsa" in human.stdout


def test_pause_and_resume_from_the_cli_suspend_the_sandbox(gateway: CliGateway, kubectl: Kubectl) -> None:
    """The same commands as on the local driver: `sandbox pause` suspends the Sandbox (its pod goes,
    the record stays Paused), `sandbox resume` brings a new pod that runs the command again."""
    created = _create(gateway, "napper")
    assert created["status"]["phase"] == "SANDBOX_PHASE_READY", created
    paused = gateway.run("sandbox", "pause", "napper")
    assert (paused.returncode, paused.stdout) == (0, "sandbox napper paused\n"), paused.stderr
    listed = gateway.run("sandbox", "list", "-o", "json")
    assert [(s["name"], s["status"]["phase"]) for s in json.loads(listed.stdout)["sandboxes"]] == [
        ("napper", "SANDBOX_PHASE_PAUSED")
    ]
    mode = kubectl("-n", NAMESPACE, "get", "sandbox", "default--napper", "-o", "jsonpath={.spec.operatingMode}")
    assert mode == "Suspended"
    resumed = gateway.run("sandbox", "resume", "napper")
    assert resumed.returncode == 0, f"{resumed.stderr}\n{gateway.log()}"
    echoed = gateway.run("sandbox", "exec", "napper", "--", "echo", "back")
    assert (echoed.returncode, echoed.stdout) == (0, "back\n"), echoed.stderr
    got = json.loads(gateway.run("sandbox", "get", "napper", "-o", "json").stdout)
    assert got["status"]["instance_id"] not in ("", created["status"]["instance_id"])
    assert gateway.run("sandbox", "delete", "napper").returncode == 0
