"""The driver's live view of the cluster: informer loops (`watching`) over our Sandboxes, their
pods and the namespace's Events, folded into `DriverEvent`s on the driver's `Hub` — a view event
whenever what `status.view` says about a sandbox changes, a deletion when its Sandbox goes, and a
progress line for each new Event about its pod or Sandbox.

With warm pooling a sandbox may be a SandboxClaim instead: then the Sandboxes and pods without our
sandbox id (pool members, adopted ones) are kept from the start, because an adopted member is the
claim's Sandbox while carrying none of our labels. The claims themselves come from the warm path's
one claim informer (`warm.allocation`), which folds each listing and change in here
(`claims_listed`, `claim_changed`) as well as into its claim activation controller; it starts
and stops with the extension APIs, and loses nothing by starting late: it lists first, and the
Sandboxes and pods it joins are already here.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence

from warmshell.core.ids import SandboxId
from warmshell.drivers.base import DriverEvent, DriverSandbox
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import kube, labels, status, watching
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import claims

__all__ = ["Informers"]

# Changes kept for `wait_objects_changed`'s names: its one waiter (the claim controller) takes them
# at once, so a few hundred cover a burst of watch events; an older generation wakes every claim.
CHANGES_KEPT = 512


def changed_since(
    changes: Sequence[tuple[int, frozenset[str] | None]], generation: int, current: int
) -> frozenset[str] | None:
    """The Sandbox names the changes after `generation` up to `current` concern, from `changes`
    (the last ones kept, generations in order, each with its names or None for every one); None
    if one concerned every Sandbox or those kept do not cover every generation in between."""
    names: set[str] = set()
    expected = current
    # From the newest back: the waiter is usually one change behind, and hundreds are kept.
    for number, concerned in reversed(changes):
        if number <= generation:
            break
        if number != expected or concerned is None:
            return None
        names |= concerned
        expected -= 1
    return frozenset(names) if expected == generation else None


class _Index:
    """Which names point at a key (a Sandbox's pod, a claim's Sandbox), kept as the objects
    change, so an event about the key finds them without a scan of every object."""

    def __init__(self) -> None:
        self._key: dict[str, str] = {}
        self._names: collections.defaultdict[str, set[str]] = collections.defaultdict(set)

    def put(self, name: str, key: str) -> None:
        """`name` now points at `key` (only)."""
        self.drop(name)
        self._key[name] = key
        self._names[key].add(name)

    def drop(self, name: str) -> None:
        """`name` points at nothing any more."""
        key = self._key.pop(name, None)
        if key is not None:
            names = self._names[key]
            names.discard(name)
            if not names:
                del self._names[key]

    def reset(self, keys: dict[str, str]) -> None:
        """Exactly these names, each pointing at its key."""
        self._key, self._names = {}, collections.defaultdict(set)
        for name, key in keys.items():
            self.put(name, key)

    def names(self, key: str) -> list[str]:
        """The names pointing at `key` now."""
        return sorted(self._names.get(key, ()))


class Informers:
    """Caches of our Sandboxes and pods by object name, kept by three informer tasks, and of our
    SandboxClaims as the warm path's claim informer folds them in."""

    def __init__(
        self, api: kube.Kube, namespace: str, hub: Hub, backoff: watching.Backoff, *, with_claims: bool = False
    ) -> None:
        self._api = api
        self._with_claims = with_claims  # claims may exist: read Sandboxes and pods wide
        self._claims: dict[str, Obj] = {}  # by claim name
        self._claim_names: dict[SandboxId, str] = {}  # our claims' names by the sandbox id they carry
        self._others: dict[str, Obj] = {}  # Sandboxes without our sandbox id, by name (claims only)
        self._namespace = namespace
        self._hub = hub
        self._backoff = backoff
        self._tasks: list[asyncio.Task[None]] = []
        self._sandboxes: dict[str, Obj] = {}
        self._pods: dict[str, Obj] = {}
        self._views: dict[SandboxId, DriverSandbox] = {}  # the last view published per sandbox
        self._ours_by_pod = _Index()  # our Sandboxes by the pod they own
        self._others_by_pod = _Index()  # the other Sandboxes by the pod they own
        self._claims_by_sandbox = _Index()  # our claims by the Sandbox they are bound to
        self._listed: set[str] = set()  # which of "sandboxes", "pods", "claims" have listed
        # Bumped on each change of a Sandbox or pod a claim may lead to (`wait_objects_changed`),
        # with the names of the Sandboxes each change concerns (None: a listing, every one).
        self._generation = 0
        self._changed = asyncio.Event()
        self._changes: collections.deque[tuple[int, frozenset[str] | None]] = collections.deque(maxlen=CHANGES_KEPT)

    def start(self) -> None:
        """Start the informer tasks (once)."""
        if self._tasks:
            return
        api, namespace, selector = self._api, self._namespace, labels.managed_selector()
        sandbox_selector, pod_selector = selector, selector
        if self._with_claims:
            # Adopted pool members carry agent-sandbox's labels only; their pods carry our managed-by.
            sandbox_selector, pod_selector = "", f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"

        async def sandboxes() -> None:
            resource = await api.sandbox_resource(namespace)
            await self._follow(resource, sandbox_selector, self._sandboxes_listed, self._sandbox_event)

        self._tasks = [
            asyncio.create_task(sandboxes(), name="k8s-informer:sandboxes"),
            asyncio.create_task(
                self._follow(kube.PODS, pod_selector, self._pods_listed, self._pod_event), name="k8s-informer:pods"
            ),
            # Event history is not progress: only Events added from now on count.
            asyncio.create_task(
                self._follow(kube.EVENTS, "", lambda _items: None, self._kube_event), name="k8s-informer:events"
            ),
        ]

    def cached_sandbox(self, name: str) -> Obj | None:
        """A Sandbox (ours, or a pool member a claim adopted) as last seen."""
        return self._others.get(name) or self._sandboxes.get(name)

    def cached_pod(self, name: str) -> Obj | None:
        """A pod of ours as last seen."""
        return self._pods.get(name)

    def claim_of(self, sandbox_id: SandboxId) -> Obj | None:
        """Our SandboxClaim carrying this sandbox id, as the claim informer last saw it."""
        # By the id, not a scan: a delete asks, and hundreds of claims exist at 45 creates/s.
        claim = self._claims.get(self._claim_names.get(sandbox_id, ""))
        return claim if claim is not None and claims.sandbox_id_of(claim) == sandbox_id else None

    def cached_views(self) -> list[DriverSandbox] | None:
        """Every sandbox's view as last published — what a LIST of the same objects joined the same
        way says, as of the last event — or None until the Sandboxes, the pods and (with claims)
        the claims have each been listed since their informer (re)started."""
        wanted = {"sandboxes", "pods", "claims"} if self._with_claims else {"sandboxes", "pods"}
        if not wanted <= self._listed:
            return None
        return list(self._views.values())

    def claims_stopped(self) -> None:
        """The claim informer stopped: its claims are not current until it lists again."""
        self._listed.discard("claims")

    async def wait_objects_changed(self, generation: int) -> tuple[int, frozenset[str] | None]:
        """The generation of the cached pods and Sandboxes without our sandbox id (pool members,
        adopted ones), once it is past `generation` (it moves on each of their changes and lists),
        with the names of the Sandboxes whose cached Sandbox or pod changed since `generation`:
        None when that is every one (a listing, or more changes than are kept)."""
        while self._generation == generation:
            await self._changed.wait()
        return self._generation, changed_since(self._changes, generation, self._generation)

    def _objects_changed(self, sandbox_names: frozenset[str] | None = None) -> None:
        self._generation += 1
        self._changes.append((self._generation, sandbox_names))
        self._changed.set()
        self._changed = asyncio.Event()

    def cached_claims(self) -> list[Obj]:
        """Our SandboxClaims as the claim informer last saw them. They stay while the informer is
        stopped: nothing is reported deleted on a 404 alone, and its next listing reports what
        went meanwhile."""
        return list(self._claims.values())

    async def aclose(self) -> None:
        """Stop the informer tasks."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._listed.discard("sandboxes")
        self._listed.discard("pods")

    async def _follow(
        self,
        resource: kube.Resource,
        selector: str,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
    ) -> None:
        await watching.follow(
            self._api,
            resource,
            self._namespace,
            label_selector=selector,
            on_list=on_list,
            on_event=on_event,
            backoff=self._backoff,
        )

    # -- Sandboxes -------------------------------------------------------------------------

    def _sandboxes_listed(self, items: list[Obj]) -> None:
        self._others = {s["metadata"]["name"]: s for s in items if not status.is_managed(s)}
        self._others_by_pod.reset({n: status.owned_pod_name(s) for n, s in self._others.items()})
        self._publish_claims()
        current = {s["metadata"]["name"]: s for s in items if status.is_managed(s)}
        # Gone while we were not watching (a relist after 410): report them deleted.
        for name in self._sandboxes.keys() - current.keys():
            self._sandbox_event("DELETED", self._sandboxes[name])
        self._sandboxes = current
        self._ours_by_pod.reset({n: status.owned_pod_name(s) for n, s in current.items()})
        for name in current:
            self._publish_view(name)
        self._listed.add("sandboxes")
        self._objects_changed()

    def _sandbox_event(self, kind: str, sandbox: Obj) -> None:
        if not status.is_managed(sandbox):
            if self._with_claims:
                name = sandbox["metadata"]["name"]
                if kind == "DELETED":
                    self._others.pop(name, None)
                    self._others_by_pod.drop(name)
                else:
                    self._others[name] = sandbox
                    self._others_by_pod.put(name, status.owned_pod_name(sandbox))
                self._publish_claims(sandbox_name=name)
                self._objects_changed(frozenset((name,)))
            return
        name = sandbox["metadata"]["name"]
        if kind == "DELETED":
            self._sandboxes.pop(name, None)
            self._ours_by_pod.drop(name)
            sandbox_id = status.sandbox_id_of(sandbox)
            if sandbox_id is not None and self._views.pop(sandbox_id, None) is not None:
                self._hub.publish(DriverEvent(sandbox_id, deleted=True))
            return
        self._sandboxes[name] = sandbox
        self._ours_by_pod.put(name, status.owned_pod_name(sandbox))
        self._publish_view(name)

    # -- pods ------------------------------------------------------------------------------

    def _pods_listed(self, items: list[Obj]) -> None:
        self._pods = {p["metadata"]["name"]: p for p in items}
        for name in list(self._sandboxes):
            self._publish_view(name)
        self._publish_claims()
        self._listed.add("pods")
        self._objects_changed()

    def _pod_event(self, kind: str, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = pod
        ours, others = self._ours_by_pod.names(name), self._others_by_pod.names(name)
        for sandbox_name in ours:
            self._publish_view(sandbox_name)
        for sandbox_name in others:
            self._publish_claims(sandbox_name=sandbox_name)
        # A pod no cached Sandbox owns leads no claim anywhere yet: its Sandbox's event will.
        if self._with_claims and (concerned := frozenset((*others, *ours))):
            self._objects_changed(concerned)

    def _publish_view(self, sandbox_name: str) -> None:
        sandbox = self._sandboxes.get(sandbox_name)
        if sandbox is None:
            return
        view = status.view(sandbox, status.own_pod(sandbox, self._pods.get(status.owned_pod_name(sandbox))))
        # Only changes: a pod status write that alters nothing we report is not an event.
        if self._views.get(view.sandbox_id) != view:
            self._views[view.sandbox_id] = view
            self._hub.publish(DriverEvent(view.sandbox_id, sandbox=view))

    # -- SandboxClaims ---------------------------------------------------------------------

    def claims_listed(self, items: list[Obj]) -> None:
        """The claim informer listed: our claims are now exactly the ones of `items`."""
        current = {c["metadata"]["name"]: c for c in items if claims.is_ours(c)}
        for name in self._claims.keys() - current.keys():
            self.claim_changed("DELETED", self._claims[name])
        self._claims = current
        self._claim_names = {i: n for n, c in current.items() if (i := claims.sandbox_id_of(c)) is not None}
        self._claims_by_sandbox.reset({n: claims.bound_sandbox_name(c) for n, c in current.items()})
        self._publish_claims()
        self._listed.add("claims")

    def claim_changed(self, kind: str, claim: Obj) -> None:
        """The claim informer saw `claim` change (`kind`: ADDED, MODIFIED, DELETED)."""
        if not claims.is_ours(claim):
            return
        name = claim["metadata"]["name"]
        sandbox_id = claims.sandbox_id_of(claim)
        if kind == "DELETED":
            self._claims.pop(name, None)
            if sandbox_id is not None and self._claim_names.get(sandbox_id) == name:
                del self._claim_names[sandbox_id]
            self._claims_by_sandbox.drop(name)
            if sandbox_id is not None and self._views.pop(sandbox_id, None) is not None:
                self._hub.publish(DriverEvent(sandbox_id, deleted=True))
            return
        self._claims[name] = claim
        if sandbox_id is not None:
            self._claim_names[sandbox_id] = name
        self._claims_by_sandbox.put(name, claims.bound_sandbox_name(claim))
        self._publish_claim(claim)

    def _publish_claims(self, *, sandbox_name: str = "") -> None:
        names = self._claims_by_sandbox.names(sandbox_name) if sandbox_name else list(self._claims)
        for name in names:
            if (claim := self._claims.get(name)) is not None:
                self._publish_claim(claim)

    def _publish_claim(self, claim: Obj) -> None:
        sandbox = self._others.get(claims.bound_sandbox_name(claim))
        pod = status.own_pod(sandbox, self._pods.get(status.owned_pod_name(sandbox))) if sandbox else None
        view = claims.view(claim, sandbox, pod)
        if self._views.get(view.sandbox_id) != view:
            self._views[view.sandbox_id] = view
            self._hub.publish(DriverEvent(view.sandbox_id, sandbox=view))

    # -- Events ----------------------------------------------------------------------------

    def _kube_event(self, kind: str, event: Obj) -> None:
        if kind != "ADDED":
            return  # repeats of an Event (count bumps) are not new progress
        involved = event.get("involvedObject") or {}
        name = str(involved.get("name") or "")
        sandbox_id: SandboxId | None = None
        if involved.get("kind") == "Pod" and name in self._pods:
            sandbox_id = status.sandbox_id_of(self._pods[name])
        elif involved.get("kind") == "Sandbox" and name in self._sandboxes:
            sandbox_id = status.sandbox_id_of(self._sandboxes[name])
        if sandbox_id is not None:
            self._hub.publish(DriverEvent(sandbox_id, progress=status.progress_line(event)))
