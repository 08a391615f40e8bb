"""Folding informer callbacks into driver events (the callbacks only; the loops are in
test_watching and the integration tests)."""

from __future__ import annotations

from typing import Any

from warmshell.drivers.base import BackendState, DriverEvent
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import watching
from warmshell.drivers.kubernetes.informers import Informers

from .fakes import FakeCluster


def setup() -> tuple[Informers, list[DriverEvent], dict[str, Any], dict[str, Any]]:
    published: list[DriverEvent] = []
    hub = Hub()
    hub.publish = published.append  # type: ignore[method-assign]
    informers = Informers(None, "warmshell", hub, watching.Backoff())  # type: ignore[arg-type]
    sandbox, pod = FakeCluster().sandbox_with_pod(sandbox_id="sbx-1")
    return informers, published, sandbox, pod


def test_views_are_published_on_change_only() -> None:
    informers, published, sandbox, pod = setup()
    informers._sandboxes_listed([sandbox])
    informers._pods_listed([])
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "supervisor", "state": {"running": {}}}]}
    informers._pod_event("MODIFIED", pod)
    informers._pod_event("MODIFIED", pod)  # nothing new
    states = [e.sandbox.state for e in published if e.sandbox is not None]
    assert states == [BackendState.PENDING, BackendState.RUNNING]


def test_a_sandbox_missing_from_a_relist_is_reported_deleted() -> None:
    informers, published, sandbox, _ = setup()
    informers._sandboxes_listed([sandbox])
    informers._sandboxes_listed([])
    assert published[-1] == DriverEvent(sandbox_id="sbx-1", deleted=True)


def test_unlabelled_sandboxes_are_ignored() -> None:
    informers, published, sandbox, _ = setup()
    del sandbox["metadata"]["labels"]["warmshell.dev/managed-by"]
    informers._sandboxes_listed([sandbox])
    informers._sandbox_event("ADDED", sandbox)
    assert published == []


def test_only_new_events_about_our_pods_become_progress() -> None:
    informers, published, sandbox, pod = setup()
    informers._sandboxes_listed([sandbox])
    informers._pods_listed([pod])
    published.clear()
    ours = {"reason": "Pulled", "message": "ok", "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"]}}
    other = {"reason": "Pulled", "message": "ok", "involvedObject": {"kind": "Pod", "name": "someone-else"}}
    informers._kube_event("ADDED", ours)
    informers._kube_event("MODIFIED", ours)
    informers._kube_event("ADDED", other)
    assert [(e.sandbox_id, e.progress and e.progress.reason) for e in published] == [("sbx-1", "Pulled")]
