"""Supervisor restarts on kubesim (`restartPolicy: OnFailure`): a supervisor killed after activation
is started again by the kubelet in the same pod, registers again with the same pod's token, and the
gateway activates it again for the same sandbox (warm: through the same claim; cold: through the
Sandbox). A workload that exits, even non-zero, ends the sandbox and is never run again."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.kubernetes.rendering import CONTAINER

from .conftest import NAMESPACE, container_pid, gateway_settings
from .test_warm import apply_pool, gateway, wait_idle

Obj = dict[str, Any]


async def pod_with_uid(admin: kc.KubeClient, uid: str) -> Obj:
    pods = (await admin.list_objects(kc.PODS, NAMESPACE)).get("items") or []
    (pod,) = [p for p in pods if p["metadata"]["uid"] == uid]
    return pod


async def wait_pod(admin: kc.KubeClient, name: str, predicate: Callable[[Obj], bool], timeout: float = 30.0) -> Obj:
    """Follow one pod on a watch until `predicate` holds for it."""
    async with asyncio.timeout(timeout):
        while True:
            listed = await admin.list_objects(kc.PODS, NAMESPACE)
            for pod in listed.get("items") or []:
                if pod["metadata"]["name"] == name and predicate(pod):
                    return pod
            version = listed["metadata"]["resourceVersion"]
            async for event in admin.watch(kc.PODS, NAMESPACE, resource_version=version, timeout_seconds=10):
                pod = event.get("object") or {}
                if (pod.get("metadata") or {}).get("name") == name and predicate(pod):
                    return pod
    raise AssertionError("unreachable")


def supervisor_status(pod: Obj) -> Obj:
    (found,) = [c for c in (pod.get("status") or {}).get("containerStatuses") or [] if c["name"] == "supervisor"]
    return dict(found)


def restarted_and_running(count: int) -> Callable[[Obj], bool]:
    def check(pod: Obj) -> bool:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return any(c["restartCount"] == count and "running" in (c.get("state") or {}) for c in statuses)

    return check


def supervisor_pid(cluster: RunningCluster, pod: Obj) -> int:
    """The host pid of `pod`'s supervisor (PID 1 of its container)."""
    return container_pid(cluster, pod, CONTAINER)


def kill_supervisor(cluster: RunningCluster, pod: Obj) -> int:
    """SIGKILL the supervisor process of `pod` (PID 1 of its container: everything in it dies)."""
    pid = supervisor_pid(cluster, pod)
    os.kill(pid, signal.SIGKILL)
    return pid


async def wait_runs(gw: RunningGateway, name: str, runs: bytes, timeout: float = 30.0) -> None:
    """Poll the workload's /workspace/runs (each run of `echo run >> /workspace/runs; ...` adds a
    line) until it reads `runs`. A workload starts just after its activation, not before Ready."""
    seen = b""
    try:
        async with asyncio.timeout(timeout):
            while (seen := (await gw.exec(name, ["cat", "/workspace/runs"]))[1]) != runs:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{name}: /workspace/runs reads {seen!r}, not {runs!r}, after {timeout}s") from None


def session(sandbox: pb.Sandbox) -> pb.Condition:
    (found,) = [c for c in sandbox.status.conditions if c.type == "SupervisorConnected"]
    return found


def reactivated_after(before: pb.Sandbox) -> Callable[[pb.Sandbox], bool]:
    """Ready again with a session that connected after `before`'s. Only an activation gives a
    new supervisor process the sandbox token that its session needs."""

    def check(sandbox: pb.Sandbox) -> bool:
        later = session(sandbox).last_transition_time_ms > session(before).last_transition_time_ms
        return sandbox.status.phase == pb.SANDBOX_PHASE_READY and session(sandbox).status == "True" and later

    return check


async def test_a_killed_warm_supervisor_is_restarted_and_activated_again_through_its_claim(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    await apply_pool(cluster, admin, tmp_path / "state", "foo", 1)
    async with gateway(cluster, tmp_path) as gw:
        await wait_idle(gw, "foo", 1)
        await gw.create(name="phoenix", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        before = await gw.wait_ready("phoenix", timeout=30)
        assert (before.status.phase, before.status.allocation) == (pb.SANDBOX_PHASE_READY, "warm")
        code, out, _ = await gw.exec("phoenix", ["sh", "-c", "echo $FOO > /workspace/kept; echo before"])
        assert (code, out) == (0, b"before\n")
        claim = await admin.get(kc.CLAIMS, NAMESPACE, "default--phoenix")
        pod = await pod_with_uid(admin, before.status.instance_id)
        assert supervisor_status(pod)["restartCount"] == 0

        kill_supervisor(cluster, pod)
        restarted = await wait_pod(admin, pod["metadata"]["name"], restarted_and_running(1))
        after = await gw.wait_for("phoenix", reactivated_after(before), timeout=30)

        # The same sandbox, pod and claim: nothing was recreated, the supervisor was re-activated.
        assert after.id == before.id
        assert after.status.instance_id == before.status.instance_id == restarted["metadata"]["uid"]
        assert after.status.allocation == "warm"
        # The timeline is the create's: the first activation and the first Ready stay.
        assert after.status.timeline.ready_us == before.status.timeline.ready_us
        assert after.status.timeline.activated_us == before.status.timeline.activated_us
        again = await admin.get(kc.CLAIMS, NAMESPACE, "default--phoenix")
        assert again["metadata"]["uid"] == claim["metadata"]["uid"]
        assert again["status"]["sandbox"] == claim["status"]["sandbox"]
        last = supervisor_status(restarted)["lastState"]["terminated"]
        assert last["exitCode"] == 128 + signal.SIGKILL
        # A new supervisor session: the restarted process, not the old stream (which the gateway may
        # or may not have seen end before the new one opened).
        assert session(after).message != session(before).message

        # exec works again, and the pod's emptyDir survived the container restart (as in Kubernetes).
        code, out, _ = await gw.exec("phoenix", ["sh", "-c", 'echo "$FOO $(cat /workspace/kept)"'])
        assert (code, out) == (0, b"bar bar\n")
        await gw.delete("phoenix")


async def test_a_killed_cold_supervisor_is_restarted_and_runs_its_workload_again(
    gw: RunningGateway, admin: kc.KubeClient, cluster: RunningCluster
) -> None:
    """A restarted container runs its command again: the workload (which died with the old
    supervisor: its agent, PID 1 of the workload container, exits when the supervisor goes) is
    started once more from the new activation."""
    command = ["sh", "-c", "echo run >> /workspace/runs; exec sleep 600"]
    await gw.create(name="coldphoenix", spec=pb.SandboxSpec(command=command))
    before = await gw.wait_ready("coldphoenix", timeout=30)
    assert (before.status.phase, before.status.allocation) == (pb.SANDBOX_PHASE_READY, "cold")
    pod = await pod_with_uid(admin, before.status.instance_id)
    # Ready is the session; the workload is started just after it. Killed before its first line
    # ran, the first run would leave no trace and the restarted one would look like the only one.
    await wait_runs(gw, "coldphoenix", b"run\n")

    kill_supervisor(cluster, pod)
    await wait_pod(admin, pod["metadata"]["name"], restarted_and_running(1))
    after = await gw.wait_for("coldphoenix", reactivated_after(before), timeout=30)
    assert (after.id, after.status.instance_id) == (before.id, before.status.instance_id)

    await wait_runs(gw, "coldphoenix", b"run\nrun\n")
    count_sleeps = "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c '^sleep$'"
    code, out, _ = await gw.exec("coldphoenix", ["sh", "-c", count_sleeps])
    assert (code, out) == (0, b"1\n")  # the first run died with its container


async def test_a_workload_that_exits_non_zero_is_not_restarted(gw: RunningGateway, admin: kc.KubeClient) -> None:
    """The supervisor exits 0 once the gateway has the workload's exit status, so OnFailure does not
    run the workload again; the sandbox ends with the workload's code."""
    await gw.create(name="once", spec=pb.SandboxSpec(command=["sh", "-c", "echo ran >> /workspace/runs; exit 3"]))
    ended = await gw.wait_for("once", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED, timeout=30)
    assert ended.status.exit_code == 3
    conditions = {c.type: c for c in ended.status.conditions}
    assert conditions["Ready"].reason == "WorkloadExited"
    assert conditions["WorkloadExited"].reason == "Failed"
    pod = await wait_pod(admin, "default--once", lambda p: (p.get("status") or {}).get("phase") == "Succeeded")
    supervisor = supervisor_status(pod)
    assert supervisor["restartCount"] == 0
    assert supervisor["state"]["terminated"]["exitCode"] == 0
    final = await gw.get("once")
    assert final.status.phase == pb.SANDBOX_PHASE_EXITED  # the pod completing does not make it an Error
    assert final.status.exit_code == 3
    assert {c.type: c for c in final.status.conditions}["Ready"].reason == "WorkloadExited"


async def test_a_paused_supervisor_misses_its_heartbeats_and_reconnects_when_it_resumes(
    cluster: RunningCluster, admin: kc.KubeClient, tmp_path: Path
) -> None:
    """The gateway closes a session whose heartbeats stop, but asks the supervisor to reconnect: one
    that was only stalled (SIGSTOP here; a long GC pause or a starved node in life) comes back on
    the same process, with no restart and the sandbox intact."""
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state) | {"heartbeat_interval_seconds": 0.2}
    async with running_gateway(state, **settings) as gw:
        await gw.create(name="sleepy", spec=pb.SandboxSpec(command=["sleep", "600"]))
        before = await gw.wait_ready("sleepy", timeout=30)
        pod = await pod_with_uid(admin, before.status.instance_id)
        pid = supervisor_pid(cluster, pod)
        os.kill(pid, signal.SIGSTOP)
        try:
            await gw.wait_for("sleepy", lambda s: session(s).status == "False", timeout=10)
            # Meanwhile an exec is told what is going on, not "is Provisioning; exec needs Ready".
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await gw.exec("sleepy", ["true"])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "its supervisor is reconnecting); retry the exec" in (refused.value.details() or "")
        finally:
            os.kill(pid, signal.SIGCONT)
        after = await gw.wait_for("sleepy", reactivated_after(before), timeout=10)
        assert after.status.instance_id == before.status.instance_id
        code, out, _ = await gw.exec("sleepy", ["echo", "awake"])
        assert (code, out) == (0, b"awake\n")
        assert supervisor_pid(cluster, pod) == pid  # the same process: it reconnected, not restarted
        assert supervisor_status(await pod_with_uid(admin, pod["metadata"]["uid"]))["restartCount"] == 0
        await gw.delete("sleepy")
