"""The workload in a container of its own, attacking from inside it on kubesim (each container
its own mount and PID namespace, only the volumes it mounts): it finds no credential, cannot see
or signal its supervisor, finds no socket to speak to it, cannot kill its own pid 1 (the agent);
and when its container ends under it (killed from outside, as an OOM kill would), the container
is restarted and counted and the sandbox has exited — it is never activated a second time."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.kubernetes.rendering import WORKLOAD_CONTAINER

from .conftest import container_pid, gateway_settings
from .test_restarts import pod_with_uid, supervisor_pid, wait_pod

# What the workload looks for, from inside its container: one line per finding (the paths are the
# rendered ones: rendering.TOKEN_PATH, the API-server token's, the channel's directory).
LOOK = r"""
for f in /var/run/secrets/warmshell/token /var/run/secrets/kubernetes.io/serviceaccount/token; do
  if cat "$f" >/dev/null 2>&1; then echo "readable $f"; fi
done
ls -A "$KUBESIM_POD_ROOT/.volumes/warmshell-token" 2>/dev/null | sed 's/^/pod-root /'
env | grep -E '^WARMSHELL_' | grep -v -E '^WARMSHELL_SANDBOX_(ID|NAME)=' | sed 's/^/env /'
for p in /proc/[0-9]*; do
  tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -q "super""visor" && echo "process ${p#/proc/}"
done
ls -A /.warmshell/channel | sed 's/^/channel /'
echo "pid1 $(cat /proc/1/comm)"
"""


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state)) as running:
        yield running


@pytest.fixture
async def victim(gw: RunningGateway) -> pb.Sandbox:
    await gw.create(name="victim", spec=pb.SandboxSpec(environment={"API_KEY": "s3cr3t"}))
    ready = await gw.wait_ready("victim", timeout=60)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    return ready


async def test_the_workload_finds_no_credential_no_supervisor_and_no_socket(
    gw: RunningGateway, cluster: RunningCluster, admin: kc.KubeClient, victim: pb.Sandbox
) -> None:
    code, out, err = await gw.exec("victim", ["sh", "-c", LOOK])
    assert code == 0, err
    # All it finds is its own pid 1, the agent; the token is there, but in the other container.
    assert out.decode().splitlines() == ["pid1 warmshell-agent"]
    assert host_token(cluster, victim)
    # Its environment is the sandbox's own, as on the local driver.
    assert await gw.exec("victim", ["sh", "-c", "echo $API_KEY"]) == (0, b"s3cr3t\n", b"")
    pod = await pod_with_uid(admin, victim.status.instance_id)
    assert {c["name"] for c in pod["status"]["containerStatuses"]} == {"supervisor", "workload"}


async def test_the_workload_cannot_signal_its_pid_1_or_its_supervisor(
    gw: RunningGateway, cluster: RunningCluster, admin: kc.KubeClient, victim: pb.Sandbox
) -> None:
    pod = await pod_with_uid(admin, victim.status.instance_id)
    supervisor = supervisor_pid(cluster, pod)
    # From inside its namespace, pid 1 takes no signal it does not handle (SIGKILL included), and
    # the supervisor's pid names nothing there (or something else of the workload's own).
    attempt = f"kill -KILL 1; kill -STOP 1; kill -TERM 1; kill -STOP {supervisor} 2>/dev/null; echo still here"
    assert await gw.exec("victim", ["sh", "-c", attempt]) == (0, b"still here\n", b"")
    assert process_state(supervisor) not in ("T", "t", "Z")
    assert await gw.exec("victim", ["echo", "alive"]) == (0, b"alive\n", b"")
    after = await pod_with_uid(admin, victim.status.instance_id)
    assert {c["name"]: c["restartCount"] for c in after["status"]["containerStatuses"]} == {
        "supervisor": 0,
        "workload": 0,
    }


async def test_a_workload_container_that_dies_is_restarted_and_its_sandbox_never_reactivated(
    gw: RunningGateway, cluster: RunningCluster, admin: kc.KubeClient, victim: pb.Sandbox
) -> None:
    pod = await pod_with_uid(admin, victim.status.instance_id)
    os.kill(agent_pid(cluster, pod), signal.SIGKILL)  # from outside, as the OOM killer would
    name = pod["metadata"]["name"]
    await wait_pod(admin, name, lambda p: workload_status(p).get("restartCount") == 1)
    ended = await gw.wait_for("victim", lambda s: s.status.phase != pb.SANDBOX_PHASE_READY, timeout=30)
    assert ended.status.phase in (pb.SANDBOX_PHASE_EXITED, pb.SANDBOX_PHASE_ERROR, pb.SANDBOX_PHASE_DELETING)
    assert ended.status.instance_id == victim.status.instance_id
    # The supervisor was not restarted: the same incarnation, and no second activation.
    now = await admin.get(kc.PODS, pod["metadata"]["namespace"], name)
    statuses = {c["name"]: c for c in now["status"]["containerStatuses"]}
    assert statuses["supervisor"]["restartCount"] == 0


def workload_status(pod: dict[str, object]) -> dict[str, object]:
    status = pod.get("status") or {}
    assert isinstance(status, dict)
    return next((c for c in status.get("containerStatuses") or [] if c["name"] == "workload"), {})


def host_token(cluster: RunningCluster, sandbox: pb.Sandbox) -> str:
    """The projected token, read on the node: it exists, just not in the workload's container."""
    assert cluster.pod_root is not None
    (pod_dir,) = [p for p in cluster.pod_root.iterdir() if p.name.endswith("_" + sandbox.status.instance_id[:8])]
    return (pod_dir / ".volumes" / "warmshell-token" / "token").read_text().strip()


def agent_pid(cluster: RunningCluster, pod: dict[str, object]) -> int:
    """The host pid of the workload container's pid 1 (the agent)."""
    return container_pid(cluster, pod, WORKLOAD_CONTAINER)


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
