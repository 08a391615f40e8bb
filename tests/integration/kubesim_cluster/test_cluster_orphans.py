"""A kubesim killed without its clean-up (SIGKILL, the OOM killer) takes its pods' processes with
it: every container, whatever it started, and each pod's network namespace holder. Otherwise they
run on, reparented to init, one supervisor and agent per pod of every killed run."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from kubesim.controllers import client as kc
from tests.helpers.kubesim_process import kubesim_serve
from tests.integration.drivers_kubernetes.conftest import IMAGE, NAMESPACE, SERVICE_ACCOUNT
from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.kubernetes import rendering

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="pods' PID namespaces and fork servers need root"),
    pytest.mark.timeout(120),
]

GONE_WITHIN_SECONDS = 5.0


def pods() -> list[dict[str, object]]:
    """A warmshell sandbox pod (init container, forked supervisor, exec'd agent), a pod with its
    own network namespace whose shell leaves a child, and one sharing its process namespace."""
    config = KubernetesDriverConfig(namespace=NAMESPACE, gateway_address="127.0.0.1:9", image=IMAGE)
    shell = {"name": "c", "image": "busybox:1", "command": ["sh", "-c", "sleep 1000 & sleep 1000"]}
    specs: dict[str, dict[str, object]] = {
        "sandbox": rendering.pod_spec(config, image=IMAGE),
        "ported": {"containers": [{**shell, "ports": [{"containerPort": 8080}]}]},
        "shared": {"shareProcessNamespace": True, "containers": [shell]},
    }
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec} for name, spec in specs.items()
    ]


async def start_pods(kubeconfig: Path) -> None:
    api = kc.KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await api.create(kc.NAMESPACES, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        service_account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}}
        await api.create(kc.SERVICEACCOUNTS, NAMESPACE, service_account)
        for pod in pods():
            await api.create(kc.PODS, NAMESPACE, pod)
        async with asyncio.timeout(60):
            while True:
                items = (await api.request("GET", kc.PODS.path(NAMESPACE, None)))["items"]
                if [(i.get("status") or {}).get("phase") for i in items] == ["Running"] * 3:
                    return
                await asyncio.sleep(0.1)
    finally:
        await api.aclose()


def descendants(root: int) -> dict[int, str]:
    """Every process under `root`: pid -> its start time (to tell a reused pid)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            found[pid] = started
            todo.append(pid)
    return found


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat after the command name; [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def running(processes: dict[int, str]) -> list[int]:
    """Those still running (a zombie has ended; reaping it is init's business)."""
    return [pid for pid, started in processes.items() if (f := _stat(pid)) and f[19] == started and f[0] != "Z"]


async def test_killing_kubesim_leaves_no_process_of_its_pods(tmp_path: Path) -> None:
    with kubesim_serve(tmp_path) as served:
        await start_pods(served.kubeconfig)
        await asyncio.sleep(1.0)  # the sandbox's supervisor and agent connect
        processes = descendants(served.process.pid)
        assert len(processes) >= 8, processes  # the pods' processes are there to be left behind
        # `kubesim serve` runs the controllers and the kubelet in its own process.
        target = served.process.pid
        processes.pop(target, None)
        os.kill(target, signal.SIGKILL)
        deadline = time.monotonic() + GONE_WITHIN_SECONDS
        while (left := running(processes)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for pid in left:  # not to leave them to the next test
            os.kill(pid, signal.SIGKILL)
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
