"""Folding informer callbacks into driver events (the callbacks only; the loops are in
test_watching and the integration tests)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.ids import Fingerprint, SandboxId
from warmshell.drivers.base import BackendState, DriverEvent
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import naming, watching
from warmshell.drivers.kubernetes.informers import Informers, changed_since
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import claims

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


RUNNING = {"phase": "Running", "containerStatuses": [{"name": "supervisor", "state": {"running": {}}}]}


def test_a_pod_event_reaches_the_sandbox_owning_it_by_the_pod_name_annotation_too() -> None:
    published: list[DriverEvent] = []
    hub = Hub()
    hub.publish = published.append  # type: ignore[method-assign]
    informers = Informers(None, "warmshell", hub, watching.Backoff())  # type: ignore[arg-type]
    cluster = FakeCluster()
    pairs = [cluster.sandbox_with_pod(sandbox_id=f"sbx-{i}", name=f"n{i}") for i in range(3)]
    informers._sandboxes_listed([s for s, _ in pairs])
    informers._pods_listed([])
    published.clear()
    sandbox, pod = pairs[1]
    pod["status"] = RUNNING
    informers._pod_event("MODIFIED", pod)
    assert [(e.sandbox_id, e.sandbox.state) for e in published if e.sandbox] == [("sbx-1", BackendState.RUNNING)]
    # The Sandbox now names another pod (agent-sandbox's pod-name annotation): that pod's events are its.
    renamed = copy.deepcopy(sandbox)
    renamed["metadata"].setdefault("annotations", {})["agents.x-k8s.io/pod-name"] = "elsewhere"
    informers._sandbox_event("MODIFIED", renamed)
    published.clear()
    informers._pod_event("MODIFIED", pod)  # the old pod: nobody's any more
    assert published == []
    moved = copy.deepcopy(pod)
    moved["metadata"]["name"] = "elsewhere"
    informers._pod_event("ADDED", moved)
    assert [e.sandbox_id for e in published if e.sandbox] == ["sbx-1"]
    informers._sandbox_event("DELETED", renamed)
    published.clear()
    informers._pod_event("MODIFIED", moved)
    assert published == []


def claim(name: str, sandbox_id: str) -> dict[str, Any]:
    who = SandboxIdentity(sandbox_id=SandboxId(sandbox_id), workspace="default", name=name, sealed_proof="s")
    ref = naming.ObjectRef("warmshell", f"default--{name}")
    rendered = claims.render_claim(ref=ref, who=who, pool="foo", gateway_id="gw", fingerprint=Fingerprint("fp"))
    rendered["metadata"]["uid"] = f"uid-{name}"
    return rendered


def with_claims() -> Informers:
    """Informers as the warm path runs them, publishing into nothing."""
    hub = Hub()
    hub.publish = lambda _event: None  # type: ignore[method-assign]
    return Informers(None, "warmshell", hub, watching.Backoff(), with_claims=True)  # type: ignore[arg-type]


def test_a_claim_is_found_by_its_sandbox_id_through_listings_and_changes() -> None:
    informers = with_claims()
    informers.claims_listed([claim("a", "id-a"), claim("b", "id-b")])
    found = informers.claim_of(SandboxId("id-b"))
    assert found is not None
    assert found["metadata"]["name"] == "default--b"
    informers.claim_changed("ADDED", claim("c", "id-c"))
    assert informers.claim_of(SandboxId("id-c")) is not None
    informers.claim_changed("DELETED", claim("b", "id-b"))
    assert informers.claim_of(SandboxId("id-b")) is None
    informers.claims_listed([claim("c", "id-c")])  # a relist: "a" went meanwhile
    assert informers.claim_of(SandboxId("id-a")) is None
    assert informers.claim_of(SandboxId("id-c")) is not None
    assert informers.claim_of(SandboxId("id-unknown")) is None


def test_cached_views_wait_for_every_listing_and_a_running_claim_informer() -> None:
    informers = with_claims()
    sandbox, pod = FakeCluster().sandbox_with_pod(sandbox_id="sbx-1")
    informers._sandboxes_listed([sandbox])
    informers._pods_listed([pod])
    assert informers.cached_views() is None  # the claims have not been listed
    informers.claims_listed([claim("a", "id-a")])
    views = informers.cached_views()
    assert views is not None
    assert {v.sandbox_id for v in views} == {"sbx-1", "id-a"}
    informers.claims_stopped()
    assert informers.cached_views() is None
    informers.claims_listed([])
    views = informers.cached_views()
    assert views is not None
    assert {v.sandbox_id for v in views} == {"sbx-1"}


async def test_a_pool_members_changes_name_the_sandbox_a_claim_resolves_through() -> None:
    informers = with_claims()
    member, pod = FakeCluster().sandbox_with_pod(sandbox_id="sbx-1")
    del member["metadata"]["labels"]["warmshell.dev/managed-by"]  # a pool member: agent-sandbox's labels only
    name = member["metadata"]["name"]
    informers._sandbox_event("ADDED", member)
    generation, names = await informers.wait_objects_changed(0)
    assert names == frozenset((name,))
    informers._pod_event("MODIFIED", pod)
    generation, names = await informers.wait_objects_changed(generation)
    assert names == frozenset((name,))  # its pod's change, by the Sandbox owning it
    stray = copy.deepcopy(pod)
    stray["metadata"]["name"] = "no-sandbox-owns-me"
    informers._pod_event("MODIFIED", stray)  # leads no claim: no change at all
    informers._pods_listed([pod])
    assert await informers.wait_objects_changed(generation) == (generation + 1, None)  # a listing: any


changes_strategy = st.lists(st.one_of(st.none(), st.frozensets(st.sampled_from("abcd"), max_size=3)), max_size=12)


@given(changes_strategy, st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=5))
def test_changed_since_is_every_name_after_the_generation_or_none(
    changes: list[frozenset[str] | None], generation: int, dropped: int
) -> None:
    generation = min(generation, len(changes))  # a waiter's generation is never ahead
    numbered = list(enumerate(changes, start=1))
    kept = numbered[dropped:]  # the oldest ones no longer kept
    after = [names for number, names in numbered if number > generation]
    found = changed_since(kept, generation, len(changes))
    if any(names is None for names in after) or any(number > generation for number, _ in numbered[:dropped]):
        assert found is None
    else:
        assert found == frozenset().union(*after)
