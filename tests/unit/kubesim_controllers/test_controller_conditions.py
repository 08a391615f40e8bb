import datetime
from typing import Any

from kubesim.controllers import conditions

Obj = dict[str, Any]
AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def sandbox(**spec: Any) -> Obj:
    return {"metadata": {"name": "sb", "namespace": "ns", "generation": 3}, "spec": spec}


def pod(phase: str = "Running", ready: bool = True, ips: bool = True) -> Obj:
    status: Obj = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ips:
        status["podIPs"] = [{"ip": "127.1.0.2"}]
    return {"metadata": {"name": "sb"}, "spec": {"nodeName": "n0"}, "status": status}


def reason(sb: Obj, p: Obj | None, svc: bool | None = None) -> tuple[str, str, str]:
    c = conditions.ready_condition(sb, p, service_exists=svc)
    assert c["observedGeneration"] == 3
    return c["status"], c["reason"], c["message"]


def test_ready_reasons_follow_the_pod() -> None:
    sb = sandbox()
    assert reason(sb, None) == ("False", "DependenciesNotReady", "Pod does not exist")
    assert reason(sb, pod("Pending")) == (
        "False",
        "DependenciesNotReady",
        "Pod exists with phase: Pending",
    )
    assert reason(sb, pod(ready=False))[2] == "Pod is Running but not Ready"
    assert reason(sb, pod(ips=False))[2] == "Pod is Ready but has no podIPs yet"
    assert reason(sb, pod()) == ("True", "DependenciesReady", "Pod is Ready")
    assert reason(sb, pod(), svc=False) == (
        "False",
        "DependenciesNotReady",
        "Pod is Ready; Service does not exist",
    )
    assert reason(sb, pod(), svc=True)[:2] == ("True", "DependenciesReady")
    assert reason(sb, pod("Succeeded")) == ("False", "PodSucceeded", "Pod completed successfully")
    assert reason(sb, pod("Failed")) == ("False", "PodFailed", "Pod failed")


def test_suspended_mode() -> None:
    sb = sandbox(operatingMode="Suspended")
    assert reason(sb, pod()) == ("False", "SandboxSuspended", "Sandbox is suspending")
    assert reason(sb, None) == ("False", "SandboxSuspended", "Sandbox is suspended")
    assert conditions.suspended_condition(sb, pod())["reason"] == "PodTerminating"
    done = conditions.suspended_condition(sb, None)
    assert (done["status"], done["reason"]) == ("True", "PodTerminated")
    assert conditions.suspended_condition(sandbox(), None)["reason"] == "NotSuspended"


def test_status_fields_only_while_a_pod_exists() -> None:
    status = conditions.sandbox_status(sandbox(), pod(), service_name=None, service_required=False, at=AT)
    assert status["selector"] == "agents.x-k8s.io/sandbox-name-hash=" + "".join(status["selector"].split("=")[1:])
    assert status["podIPs"] == ["127.1.0.2"]
    assert status["nodeName"] == "n0"
    assert [c["type"] for c in status["conditions"]] == ["PodScheduled", "Ready", "Suspended"]
    gone = conditions.sandbox_status(
        {**sandbox(), "status": status}, None, service_name=None, service_required=False, at=AT
    )
    assert "podIPs" not in gone
    assert "nodeName" not in gone
    assert gone["selector"] == status["selector"]  # kept once set
    assert [c["type"] for c in gone["conditions"]] == ["Ready", "Suspended"]


def test_finished_condition_only_for_terminal_pods() -> None:
    status = conditions.sandbox_status(sandbox(), pod("Succeeded"), service_name=None, service_required=False, at=AT)
    finished = [c for c in status["conditions"] if c["type"] == "Finished"]
    assert finished[0]["status"] == "True"
    assert finished[0]["reason"] == "PodSucceeded"


def test_ready_keeps_transition_time_while_status_is_unchanged() -> None:
    first = conditions.sandbox_status(sandbox(), pod(), service_name=None, service_required=False, at=AT)
    later = AT + datetime.timedelta(minutes=5)
    second = conditions.sandbox_status(
        {**sandbox(), "status": first}, pod(), service_name=None, service_required=False, at=later
    )
    ltt = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert ltt["Ready"] == "2026-01-01T00:00:00Z"


def test_node_name_alone_is_not_written_while_not_ready() -> None:
    old = {"conditions": [{"type": "Ready", "status": "False"}]}
    new = {**old, "nodeName": "n0"}
    assert conditions.status_patch(old, new) is None
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    assert conditions.status_patch(old, {**ready, "nodeName": "n0"}) == {
        "status": {"conditions": ready["conditions"], "nodeName": "n0"}
    }
    assert conditions.status_patch(ready, dict(ready)) is None
