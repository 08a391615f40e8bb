"""Containers of an image with ``preload`` modules are forked from a pre-imported fork server, and
every other container from the fork server that execs: PID 1 of their own PID namespace, in the
pod's mount namespace, with their env, cwd and exit codes, and no launcher process beside them."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
from collections.abc import AsyncIterator

import pytest
from ksc_helpers import NS, get_or_none, wait_for, wait_gone

from kubesim.cluster import RunningCluster, running_cluster
from kubesim.controllers import client as kc
from kubesim.kubelet import containers

HERE = pathlib.Path(__file__).parent
IMAGES = {
    "example.com/forkprobe:*": {
        "entrypoint": [sys.executable, "-m", "forkprobe"],
        "overrideCommand": True,
        "preload": ["forkprobe"],
    },
    "example.com/execprobe:*": {"entrypoint": [sys.executable, "-m", "forkprobe"], "overrideCommand": True},
    # The module as one of the image's programs, its entrypoint something else.
    "example.com/forkprobe-programs:*": {
        "entrypoint": ["sh", "-c", "exit 0"],
        "programs": {"probe": [sys.executable, "-m", "forkprobe"]},
        "preload": ["forkprobe"],
    },
}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="forked containers need mount namespaces (root)")


@pytest.fixture
async def cluster(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningCluster]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    async with running_cluster(image_map=IMAGES) as running:
        yield running


def probe_pod(name: str, out: pathlib.Path, *args: str, image: str = "example.com/forkprobe:1") -> dict[str, object]:
    container = {
        "name": "main",
        "image": image,
        "args": list(args),
        "workingDir": "/data",
        "env": [{"name": "PROBE_OUT", "value": str(out)}, {"name": "PROBE_NAME", "value": name}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def terminated(api: kc.KubeClient, name: str) -> dict[str, object] | None:
    obj = await get_or_none(api, kc.PODS, name)
    statuses = (obj or {}).get("status", {}).get("containerStatuses") or []
    return statuses[0]["state"].get("terminated") if statuses else None


def process_group(pgid: int) -> list[int]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == pgid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def parent_of(pid: int) -> int:
    return int((pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_forked_container_is_pid_1_in_its_pod_and_reports_its_exit_code(
    cluster: RunningCluster, tmp_path: pathlib.Path
) -> None:
    api = cluster.client()
    try:
        out = tmp_path / "seen.json"
        await api.create(kc.PODS, NS, probe_pod("forked", out, "3"))
        state = await wait_for(lambda: terminated(api, "forked"), lambda t: t is not None, what="exited")
        assert state is not None
        assert state["exitCode"] == 3
        seen = json.loads(out.read_text())
        assert seen["preloaded"], "the container was exec'd, not forked from the preloaded server"
        assert seen["pid"] == 1
        assert seen["pids"] == [1], "the container sees processes outside its PID namespace"
        assert seen["volume"]
        assert seen["cwd"].endswith("/data")  # the working dir's host path, as for an exec'd container
        assert seen["argv"] == ["3"]
        assert seen["env"] == {"PROBE_OUT": str(out), "PROBE_NAME": "forked"}
        assert "forked" in seen["hosts"]
        phase = (await api.get(kc.PODS, NS, "forked"))["status"]["phase"]
        assert phase == "Failed"
    finally:
        await api.aclose()


async def test_an_image_without_preload_is_still_execd(cluster: RunningCluster, tmp_path: pathlib.Path) -> None:
    api = cluster.client()
    try:
        out = tmp_path / "seen.json"
        await api.create(kc.PODS, NS, probe_pod("execd", out, "0", image="example.com/execprobe:1"))
        state = await wait_for(lambda: terminated(api, "execd"), lambda t: t is not None, what="exited")
        assert state is not None
        assert state["exitCode"] == 0
        seen = json.loads(out.read_text())
        assert not seen["preloaded"]
        assert seen["pid"] == 1  # exec'd, it is still PID 1 of a namespace of its own
    finally:
        await api.aclose()


async def test_deleting_a_forked_pod_sends_sigterm_and_kill_takes_the_whole_container(
    cluster: RunningCluster, tmp_path: pathlib.Path
) -> None:
    api = cluster.client()
    try:
        out = tmp_path / "seen.json"
        container, server = await running_waiter(cluster, api, "waiter", out)
        assert parent_of(container) == server, "the container was not forked from the fork server"
        assert process_group(container) == [container]
        await api.delete(kc.PODS, NS, "waiter")
        await wait_gone(api, kc.PODS, "waiter", within=4.0)  # inside the grace: SIGTERM was handled
        assert out.with_name(out.name + ".term").exists()
        assert not pathlib.Path(f"/proc/{container}").exists()
    finally:
        await api.aclose()


async def asyncio_exists(path: pathlib.Path) -> bool:
    return path.exists()


async def running_waiter(
    cluster: RunningCluster, api: kc.KubeClient, name: str, out: pathlib.Path, *, image: str = "example.com/forkprobe:1"
) -> tuple[int, int]:
    """Start a pod that waits for SIGTERM; its container's pid and its fork server's."""
    created = await api.create(kc.PODS, NS, probe_pod(name, out, "wait", image=image))
    await wait_for(lambda: asyncio_exists(out), bool, what="container running")
    assert cluster.components.kubelet is not None
    worker = cluster.components.kubelet._workers[created["metadata"]["uid"]]
    assert worker.ctx.fork_server is not None
    preload = ("forkprobe",) if image.startswith("example.com/forkprobe") else ()
    server = worker.ctx.fork_server(preload).pid
    assert server is not None

    async def held() -> containers.ContainerProcess | None:
        return worker.procs.get("main")

    # The container can write its file before the kubelet has read the server's report of its pid.
    proc = await wait_for(held, lambda p: p is not None, what="the kubelet holding the container")
    assert proc is not None
    return proc.pid, server


async def test_an_execd_container_is_forked_by_the_exec_server_with_no_launcher_beside_it(
    cluster: RunningCluster, tmp_path: pathlib.Path
) -> None:
    api = cluster.client()
    try:
        out = tmp_path / "seen.json"
        container, server = await running_waiter(cluster, api, "execd", out, image="example.com/execprobe:1")
        # The process the kubelet holds is the container's PID 1 itself, a child of the server.
        assert parent_of(container) == server
        assert json.loads(out.read_text())["pid"] == 1
        await api.delete(kc.PODS, NS, "execd")
        await wait_gone(api, kc.PODS, "execd", within=4.0)
        assert out.with_name(out.name + ".term").exists()
    finally:
        await api.aclose()


async def test_a_command_that_does_not_exist_ends_its_container_with_127(cluster: RunningCluster) -> None:
    api = cluster.client()
    try:
        pod = probe_pod("missing", pathlib.Path("/nonexistent"), image="busybox:1")
        pod["spec"]["containers"][0]["command"] = ["/no/such/program"]  # type: ignore[index]
        await api.create(kc.PODS, NS, pod)
        state = await wait_for(lambda: terminated(api, "missing"), lambda t: t is not None, what="exited")
        assert state is not None
        assert state["exitCode"] == 127
    finally:
        await api.aclose()


async def test_a_killed_fork_server_takes_its_containers_with_it(
    cluster: RunningCluster, tmp_path: pathlib.Path
) -> None:
    api = cluster.client()
    try:
        out = tmp_path / "seen.json"
        container, server = await running_waiter(cluster, api, "orphan", out)
        os.kill(server, signal.SIGKILL)
        state = await wait_for(lambda: terminated(api, "orphan"), lambda t: t is not None, what="exited")
        assert state is not None
        assert state["exitCode"] == 137
        await wait_for(lambda: asyncio_exists(pathlib.Path(f"/proc/{container}")), lambda alive: not alive, what="gone")
        assert not out.with_name(out.name + ".term").exists()  # killed, not asked to stop
    finally:
        await api.aclose()


async def test_an_init_container_running_one_of_the_images_programs_is_forked_too(
    cluster: RunningCluster, tmp_path: pathlib.Path
) -> None:
    """An image's ``programs`` (``warmshell install-agent``, a pod's init container) are its own
    Python modules as much as its entrypoint: forked from the preloaded server, not a Python start."""
    api = cluster.client()
    try:
        out = tmp_path / "seen.json"
        pod = probe_pod("programs", out, "0", image="example.com/forkprobe-programs:1")
        container = pod["spec"]["containers"][0]  # type: ignore[index]
        pod["spec"]["initContainers"] = [{**container, "name": "init", "command": ["probe"]}]  # type: ignore[index]
        container["env"] = [{"name": "PROBE_OUT", "value": str(tmp_path / "main.json")}]
        await api.create(kc.PODS, NS, pod)
        state = await wait_for(lambda: terminated(api, "programs"), lambda t: t is not None, what="exited")
        assert state is not None
        seen = json.loads(out.read_text())
        assert seen["preloaded"], "the init container was exec'd, not forked from the preloaded server"
        assert seen["pid"] == 1
        assert seen["argv"] == ["0"]
    finally:
        await api.aclose()


async def test_a_container_sharing_its_pods_process_namespace_joins_no_other_containers(
    cluster: RunningCluster, tmp_path: pathlib.Path
) -> None:
    """A pod with ``shareProcessNamespace`` runs in the server's PID namespace, not in the one the
    server made for the container forked before it (another pod's, whose processes it would see)."""
    api = cluster.client()
    try:
        await running_waiter(cluster, api, "waiter", tmp_path / "waiter.json")
        out = tmp_path / "shared.json"
        pod = probe_pod("shared", out, "0")
        pod["spec"]["shareProcessNamespace"] = True  # type: ignore[index]
        await api.create(kc.PODS, NS, pod)
        await wait_for(lambda: terminated(api, "shared"), lambda t: t is not None, what="exited")
        seen = json.loads(out.read_text())
        # In the waiter's namespace it would be its PID 2; in the server's it has a host pid.
        assert seen["pid"] > 2, seen["pid"]
    finally:
        await api.aclose()
