"""Sandbox + pod -> DriverSandbox, and Events -> progress lines."""

from __future__ import annotations

from typing import Any

from warmshell.drivers.base import BackendState, DriverCondition
from warmshell.drivers.kubernetes import status

from .fakes import FakeCluster


def scene() -> tuple[dict[str, Any], dict[str, Any]]:
    return FakeCluster().sandbox_with_pod(sandbox_id="sbx-1")


def conditions(view: Any) -> dict[str, DriverCondition]:
    return {c.type: c for c in view.conditions}


def container(**state: Any) -> dict[str, Any]:
    return {"name": "supervisor", "image": "img:1", "state": state}


def test_a_sandbox_without_a_pod_is_pending() -> None:
    sandbox, _ = scene()
    view = status.view(sandbox, None)
    assert view.sandbox_id == "sbx-1"
    assert view.state == BackendState.PENDING
    assert view.instance_id == ""
    assert conditions(view)["SandboxReady"].reason == "NotObserved"


def test_the_sandbox_ready_condition_is_mirrored() -> None:
    sandbox, _ = scene()
    sandbox["status"] = {
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "DependenciesNotReady", "message": "Pod does not exist"}
        ]
    }
    assert conditions(status.view(sandbox, None))["SandboxReady"] == DriverCondition(
        "SandboxReady", "False", "DependenciesNotReady", "Pod does not exist"
    )


def test_an_unschedulable_pod_says_why() -> None:
    sandbox, pod = scene()
    message = "0/3 nodes are available: 3 Insufficient cpu."
    pod["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
    }
    view = status.view(sandbox, pod)
    assert view.state == BackendState.PENDING
    assert view.instance_id == pod["metadata"]["uid"]
    assert conditions(view)["PodScheduled"] == DriverCondition("PodScheduled", "False", "Unschedulable", message)


def test_a_pulling_image_shows_as_an_unknown_image_condition() -> None:
    sandbox, pod = scene()
    pod["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [container(waiting={"reason": "ContainerCreating"})],
    }
    got = conditions(status.view(sandbox, pod))
    assert got["PodScheduled"].status == "True"
    assert (got["ImagePulled"].status, got["ImagePulled"].reason) == ("Unknown", "Pulling")
    assert got["ContainerRunning"].reason == "ContainerCreating"


def test_an_image_that_cannot_be_pulled_stays_pending_with_the_message() -> None:
    sandbox, pod = scene()
    message = 'Back-off pulling image "img:1"'
    pod["status"] = {
        "phase": "Pending",
        "containerStatuses": [container(waiting={"reason": "ImagePullBackOff", "message": message})],
    }
    view = status.view(sandbox, pod)
    assert view.state == BackendState.PENDING  # the kubelet keeps trying
    assert conditions(view)["ImagePulled"] == DriverCondition("ImagePulled", "False", "ImagePullBackOff", message)


def test_an_invalid_image_name_fails_for_good() -> None:
    sandbox, pod = scene()
    pod["status"] = {
        "phase": "Pending",
        "containerStatuses": [container(waiting={"reason": "InvalidImageName", "message": "bad ref"})],
    }
    view = status.view(sandbox, pod)
    assert view.state == BackendState.FAILED
    assert "InvalidImageName" in view.message


def test_a_running_pod_is_running() -> None:
    sandbox, pod = scene()
    pod["status"] = {"phase": "Running", "containerStatuses": [container(running={"startedAt": "now"})]}
    view = status.view(sandbox, pod)
    assert view.state == BackendState.RUNNING
    assert conditions(view)["ContainerRunning"].status == "True"
    assert conditions(view)["ImagePulled"].status == "True"


def test_a_failed_container_fails_the_sandbox_with_its_exit() -> None:
    sandbox, pod = scene()
    pod["status"] = {
        "phase": "Failed",
        "containerStatuses": [container(terminated={"exitCode": 137, "reason": "OOMKilled"})],
    }
    view = status.view(sandbox, pod)
    assert view.state == BackendState.FAILED
    assert "exited with code 137 (OOMKilled)" in view.message
    assert conditions(view)["ContainerRunning"] == DriverCondition(
        "ContainerRunning", "False", "OOMKilled", view.message
    )


def restarted(restarts: int, **state: Any) -> dict[str, Any]:
    """The supervisor container after `restarts` restarts, the last run killed by SIGKILL."""
    return {
        **container(**state),
        "restartCount": restarts,
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}},
    }


def test_a_crashed_supervisor_backing_off_keeps_the_pod_running() -> None:
    """restartPolicy OnFailure: the kubelet starts the supervisor again in the same pod."""
    sandbox, pod = scene()
    pod["status"] = {"phase": "Running", "containerStatuses": [restarted(1, waiting={"reason": "CrashLoopBackOff"})]}
    view = status.view(sandbox, pod)
    assert view.state == BackendState.RUNNING
    got = conditions(view)
    assert got["ImagePulled"].status == "True"  # it ran; the back-off is not a pull
    assert (got["ContainerRunning"].status, got["ContainerRunning"].reason) == ("False", "CrashLoopBackOff")
    assert "exited with code 137" in got["ContainerRunning"].message


def test_a_restarted_supervisor_is_running_and_says_it_restarted() -> None:
    sandbox, pod = scene()
    pod["status"] = {"phase": "Running", "containerStatuses": [restarted(1, running={"startedAt": "now"})]}
    view = status.view(sandbox, pod)
    assert view.state == BackendState.RUNNING
    running = conditions(view)["ContainerRunning"]
    assert running.status == "True"
    assert "restarts: 1" in running.message
    assert "exited with code 137" in running.message


def test_a_supervisor_restarted_up_to_the_limit_fails_the_sandbox() -> None:
    """As a Job with restartPolicy OnFailure fails at its backoffLimit."""
    sandbox, pod = scene()
    for restarts in range(status.RESTART_LIMIT):
        pod["status"] = {"phase": "Running", "containerStatuses": [restarted(restarts, running={"startedAt": "x"})]}
        assert status.view(sandbox, pod).state == BackendState.RUNNING
    limit = status.RESTART_LIMIT
    for state in ({"waiting": {"reason": "CrashLoopBackOff"}}, {"running": {"startedAt": "x"}}):
        pod["status"] = {"phase": "Running", "containerStatuses": [restarted(limit, **state)]}
        view = status.view(sandbox, pod)
        assert view.state == BackendState.FAILED
        assert "exited with code 137" in view.message
        assert f"restarts: {limit}" in view.message
        assert conditions(view)["ContainerRunning"] == DriverCondition(
            "ContainerRunning", "False", "BackoffLimitExceeded", view.message
        )


def test_a_completed_pod_exited() -> None:
    sandbox, pod = scene()
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [container(terminated={"exitCode": 0})]}
    assert status.view(sandbox, pod).state == BackendState.EXITED


def test_a_sandbox_whose_pod_failed_and_is_gone_is_failed() -> None:
    sandbox, _ = scene()
    sandbox["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed", "message": "x"}]}
    assert status.view(sandbox, None).state == BackendState.FAILED


def test_ownership_is_by_uid() -> None:
    sandbox, pod = scene()
    assert status.pod_belongs_to(pod, sandbox)
    pod["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-older-sandbox"
    assert not status.pod_belongs_to(pod, sandbox)
    assert status.owned_pod_name(sandbox) == sandbox["metadata"]["name"]
    sandbox["metadata"]["annotations"]["agents.x-k8s.io/pod-name"] = "pool-abcde"
    assert status.owned_pod_name(sandbox) == "pool-abcde"


def test_unlabelled_objects_are_not_ours() -> None:
    sandbox, _ = scene()
    assert status.is_managed(sandbox)
    del sandbox["metadata"]["labels"]["warmshell.dev/managed-by"]
    assert not status.is_managed(sandbox)
    assert not status.is_managed({"metadata": {"labels": {"warmshell.dev/managed-by": "warmshell"}}})


def test_events_become_progress_lines() -> None:
    pulling = {
        "type": "Normal",
        "reason": "Pulling",
        "message": 'Pulling image "img:1"',
        "involvedObject": {"kind": "Pod", "name": "default--one"},
    }
    line = status.progress_line(pulling)
    assert (line.reason, line.message, line.warning) == ("Pulling", 'pod: Pulling image "img:1"', False)
    failed = {"type": "Warning", "reason": "FailedScheduling", "message": "0/3 nodes", "involvedObject": {}}
    assert status.progress_line(failed).warning
