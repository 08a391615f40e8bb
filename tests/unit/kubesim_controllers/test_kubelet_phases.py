import pathlib
from typing import Any

import pytest

from kubesim import timing
from kubesim.kubelet import containers
from kubesim.kubelet.images import ImageMap
from kubesim.kubelet.pods import PodContext, PodWorker


def worker(restart: str = "Always", inits: int = 0) -> PodWorker:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "0123456789"},
        "spec": {
            "restartPolicy": restart,
            "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}],
            "initContainers": [{"name": f"i{n}", "image": "busybox"} for n in range(inits)],
        },
    }
    ctx = PodContext(
        api=None,  # type: ignore[arg-type]  # phase/status computation never calls the API
        image_map=ImageMap(),
        timing=timing.FAST,
        root=pathlib.Path("/nonexistent"),
        base_env={},
    )
    return PodWorker(ctx, pod, node="n0", ip="127.1.0.2")


def finish(w: PodWorker, name: str, code: int) -> None:
    state = w.states[name]
    state.started_at = "2026-01-01T00:00:00Z"
    state.waiting_reason = None
    state.terminated = containers.terminated(code, state.started_at)


def run(w: PodWorker, name: str) -> None:
    state = w.states[name]
    state.started_at, state.waiting_reason = "2026-01-01T00:00:00Z", None
    w.ever_started = True


def test_pending_until_a_container_starts() -> None:
    w = worker()
    assert w.phase() == "Pending"
    status = w.status()
    assert "podIP" not in status
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Initialized": "True",
        "Ready": "False",
        "ContainersReady": "False",
        "PodScheduled": "True",
    }
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}


def test_running_and_ready_when_all_containers_are_ready() -> None:
    w = worker()
    w.with_ip = True
    run(w, "a")
    run(w, "b")
    assert w.phase() == "Running"
    w.states["a"].ready = True
    assert w.status()["conditions"][1] == {
        "type": "Ready",
        "status": "False",
        "lastTransitionTime": w.status()["conditions"][1]["lastTransitionTime"],
    }
    w.states["b"].ready = True
    status = w.status()
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert status["podIPs"] == [{"ip": "127.1.0.2"}]


@pytest.mark.parametrize(
    ("restart", "codes", "phase"),
    [
        ("Never", (0, 0), "Succeeded"),
        ("Never", (0, 1), "Failed"),
        ("OnFailure", (0, 0), "Succeeded"),
        ("OnFailure", (0, 1), "Running"),  # the failed one will restart
        ("Always", (0, 0), "Running"),
    ],
)
def test_terminal_phases_follow_restart_policy(restart: str, codes: tuple[int, int], phase: str) -> None:
    w = worker(restart)
    w.ever_started = True
    finish(w, "a", codes[0])
    finish(w, "b", codes[1])
    assert w.phase() == phase


def test_failed_init_container_with_never_fails_the_pod() -> None:
    w = worker("Never", inits=1)
    w.init_states["i0"].terminated = containers.terminated(2, None)
    assert w.phase() == "Failed"
    assert w.status()["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 2
