"""The claim activation controller: when agent-sandbox binds one of our SandboxClaims to a warm
Sandbox, activate the supervisor already registered from that Sandbox's pod.

Triggers: the driver's one claim informer (the warm path feeds each listing and change in:
`replace`, `changed`), a resync from that informer's cache every 15 s (a claim whose pod was not
found yet is tried again at most that much later, with no API read to find it), and every change
of the gateway's registrations (a pod that registers after its claim was bound).
A registration change wakes only the claims whose pod the activator now holds (`Activator.holds`,
looked up in an index of parked claims by pod uid) and those still resolving their pod: with
replicas, every claim another replica activated stays parked here until its sandbox goes, so
retrying them all on each registration cost work in proportion to the live warm sandboxes.
Each claim is followed claim → `status.sandbox.name` → Sandbox (controller = the claim's uid) →
pod (controller = the Sandbox's uid); the sealed proof must open for (namespace, claim name,
sandbox id). Work is deduplicated by claim uid, at most 32 activations run at once, a claim whose
pod's supervisor is not registered here is parked until a registration arrives (retrying a parked
claim is one in-memory call, no API reads), and every give-up is logged at warning.

With several gateway replicas every replica runs this controller, and each activates only the
registrations it holds: the activator refuses an instance not registered on this replica, so the
claim waits parked here while the replica holding the pod's registration activates it. A
registration that arrives later (a supervisor reconnecting through the Service to this replica)
wakes the parked claim. A claim is never activated by a replica that does not hold the stream the
activation is sent down, so it cannot be activated twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
    UnavailableError,
    WarmshellError,
)
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.core.models import now_us
from warmshell.drivers.base import Activator, DriverEvent, ProgressLine
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import kube, labels, proofs, status
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.warm import claims

__all__ = ["NOT_STARTED", "CachedObjects", "ClaimActivation", "ClaimRefused", "NotStarted", "Target", "resolve_target"]

log = logging.getLogger(__name__)

RESYNC_SECONDS = 15.0
MAX_IN_FLIGHT = 32
# Waits between attempts while the supervisor has not registered; then the claim waits quietly
# for the next registration change or resync.
RETRY_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
# How long a bound claim waits for the informers to show its Sandbox adopted and its pod before
# reading them live. Their next change alone was not enough: under warm creates at 6/s some other
# pod's status write woke the claim first, and each later attempt read the chain live until the
# informers caught up (2.3 Sandbox and 2.3 pod GETs per create on top of the registration's).
CACHE_WAIT_SECONDS = 1.0


class NotStarted:
    """The activator before the gateway hands its own to the driver (`start`): it holds no
    registration and activates nothing."""

    async def activate(
        self, *, instance_id: InstanceId, sandbox_id: SandboxId, proof: str, reason: str, claimed_us: int = 0
    ) -> None:
        """Refused: nothing can be activated before the gateway has started the driver."""
        raise FailedPreconditionError("the driver is not started: nothing can be activated yet")

    async def wait_registrations_changed(self, generation: int) -> int:
        """Never: no registration reaches a driver that is not started."""
        await asyncio.Event().wait()
        return generation

    def holds(self, instance_id: InstanceId) -> bool:
        """Nothing is held before start."""
        return False

    def idle_members(self) -> Counter[Fingerprint]:
        """No member is registered before start."""
        return Counter()


NOT_STARTED = NotStarted()


class ClaimRefused(WarmshellError):
    """The claim's chain (claim → Sandbox → pod → proof) does not hold: never activate it."""


@dataclass(frozen=True)
class Target:
    """Who to activate, for which sandbox, as the chain established it."""

    pod_uid: InstanceId
    pod_name: str
    sandbox_name: str
    sandbox_id: SandboxId
    proof: str
    bound_us: int = 0  # when this controller first found the claim bound (the timeline's claimed_us)


class CachedObjects(Protocol):
    """Sandboxes, pods and claims as the driver's informers last saw them (`Informers`)."""

    def cached_sandbox(self, name: str) -> Obj | None: ...

    def cached_pod(self, name: str) -> Obj | None: ...

    def cached_claims(self) -> list[Obj]: ...

    async def wait_objects_changed(self, generation: int) -> tuple[int, frozenset[str] | None]:
        """Return the generation of the cached Sandboxes and pods once it is past `generation`,
        with the names of the Sandboxes whose cached Sandbox or pod changed meanwhile (None: any)."""
        ...


async def resolve_target(
    api: kube.Kube,
    sealer: proofs.ProofSealer,
    claim: Mapping[str, Any],
    cache: CachedObjects | None = None,
    *,
    live: bool = True,
) -> Target | None:
    """Follow a bound claim to its pod; None while it is not bound or the pod does not exist yet.
    With `cache`, a chain that holds on the cached Sandbox and pod is taken from there (two GETs
    fewer per claim on every replica); anything missing or not holding there is read live, and
    only the live objects can refuse the claim (a stale cache never does). Without `live`, a
    chain the cache does not hold is None (not found yet) instead of a live read."""
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    sandbox_id = claims.sandbox_id_of(claim)
    if not claims.is_ours(claim) or sandbox_id is None:
        raise ClaimRefused(f"SandboxClaim {namespace}/{name} is not one of ours")
    sealed = str((meta.get("annotations") or {}).get(labels.ACTIVATION_PROOF) or "")
    proof = sealer.open(sealed, namespace=namespace, name=name, sandbox_id=sandbox_id)
    if proof is None:
        raise ClaimRefused(f"SandboxClaim {namespace}/{name} carries no valid activation proof")
    sandbox_name = claims.bound_sandbox_name(claim)
    if not sandbox_name:
        return None
    if cache is not None and (cached := _cached_target(cache, claim, sandbox_name, sandbox_id, proof)) is not None:
        return cached
    if not live:
        return None
    resource = await api.sandbox_resource(namespace)
    try:
        sandbox = await api.get(resource, namespace, sandbox_name)
    except kube.NotFound:
        return None
    if not claims.controlled_by(sandbox, str(meta.get("uid") or "")):
        raise ClaimRefused(f"Sandbox {namespace}/{sandbox_name} is not controlled by SandboxClaim {name}")
    if not claims.runs_requested_shape(claim, sandbox):
        raise ClaimRefused(f"Sandbox {namespace}/{sandbox_name} does not run the shape SandboxClaim {name} asked for")
    pod_name = status.owned_pod_name(sandbox)
    try:
        pod = await api.get(kube.PODS, namespace, pod_name)
    except kube.NotFound:
        return None
    if not status.pod_belongs_to(pod, sandbox):
        raise ClaimRefused(f"pod {namespace}/{pod_name} is not controlled by Sandbox {sandbox_name}")
    pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
    return Target(InstanceId(pod_uid), pod_name, sandbox_name, sandbox_id, proof)


def _cached_target(
    cache: CachedObjects, claim: Mapping[str, Any], sandbox_name: str, sandbox_id: SandboxId, proof: str
) -> Target | None:
    """The chain claim → Sandbox → pod on cached objects, when every link holds there (the same
    uid checks as the live path: uids never change, so a chain that holds once holds)."""
    sandbox = cache.cached_sandbox(sandbox_name)
    uid = str((claim.get("metadata") or {}).get("uid") or "")
    if sandbox is None or not claims.controlled_by(sandbox, uid) or not claims.runs_requested_shape(claim, sandbox):
        return None
    pod_name = status.owned_pod_name(sandbox)
    pod = cache.cached_pod(pod_name)
    if pod is None or not status.pod_belongs_to(pod, sandbox):
        return None
    pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
    return Target(InstanceId(pod_uid), pod_name, sandbox_name, sandbox_id, proof)


@dataclass(eq=False)
class _Claim:
    """One claim and where its activation stands."""

    uid: str
    claim: Obj
    done: bool = False  # activated or given up
    task: asyncio.Task[None] | None = None  # the activation running now
    wake: asyncio.Event | None = None  # cuts the running task's backoff short
    # Known pod, not registered here after the backoff: tried again (one in-memory call, no API
    # reads) on each registration change. After a gateway restart every running warm sandbox's
    # claim is parked, as their supervisors never register again.
    parked: Target | None = None
    pod: InstanceId | None = None  # the pod its chain leads to, once resolved
    waiting: bool = False  # not scheduled because of the bound; scheduled on a free slot
    warned: bool = False


class ClaimActivation:
    """Runs the triggers and the bounded, deduplicated activation tasks. Each claim bound and
    activated is published: a "Claimed" progress line on `hub`. Built with the driver; activates
    through the activator `start` hands it, until `aclose`."""

    def __init__(
        self,
        api: kube.Kube,
        namespace: str,
        sealer: proofs.ProofSealer,
        cache: CachedObjects,
        *,
        hub: Hub | None = None,
        resync_seconds: float | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._sealer = sealer
        self._cache = cache  # the informers' objects: the claims to act on, and their chains
        self._activator: Activator = NOT_STARTED
        self._hub = hub or Hub()
        self._resync_seconds = resync_seconds or RESYNC_SECONDS  # read late: tests shorten it
        self._max = max_in_flight
        self._claims: dict[str, _Claim] = {}  # by uid
        self._parked: dict[InstanceId, _Claim] = {}  # parked claims by the pod uid they wait for
        self._running: set[_Claim] = set()  # claims with a task
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = True  # not started, or closing: nothing is scheduled

    @property
    def in_flight(self) -> int:
        """Activations running now."""
        return len(self._running)

    def start(self, activator: Activator) -> None:
        """Activate through `activator` from now on: the claims cached so far at once, then on
        each change the informer feeds in, each resync and each registration change."""
        self._activator = activator
        self._stopped = False
        self._tasks = [
            asyncio.create_task(self._resync_forever(), name="k8s-claims:resync"),
            asyncio.create_task(self._on_registrations(), name="k8s-claims:registrations"),
            asyncio.create_task(self._on_cached_objects(), name="k8s-claims:objects"),
        ]
        self.resync()

    async def wait_in_flight(self) -> None:
        """Return once the activations running now have ended (those they schedule included)."""
        while running := [c.task for c in self._claims.values() if c.task is not None]:
            await asyncio.gather(*running, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop everything, including activations in flight."""
        self._stopped = True
        tasks = [*self._tasks]
        for record in self._claims.values():
            if record.task is not None:
                tasks.append(record.task)
                record.task, record.wake = None, None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._running.clear()

    # -- triggers ----------------------------------------------------------------------------

    def changed(self, kind: str, claim: Obj) -> None:
        """The claim informer saw `claim` change (`kind`: ADDED, MODIFIED, DELETED)."""
        uid = str(claim["metadata"].get("uid") or "")
        if kind == "DELETED":
            self._forget(uid)
            return
        self._consider(self._record(uid, claim))

    async def _resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self._resync_seconds)  # a period, not a wait for a condition
            self.resync()

    def resync(self) -> None:
        """Consider every claim the informer holds again (those not found bound to a registered
        pod yet are retried; those done stay done). Reads nothing from the API."""
        self.replace(self._cache.cached_claims())

    async def _on_registrations(self) -> None:
        generation = 0
        while True:
            generation = await self._activator.wait_registrations_changed(generation)
            self.registrations_changed()

    async def _on_cached_objects(self) -> None:
        generation = 0
        while True:
            generation, sandbox_names = await self._cache.wait_objects_changed(generation)
            self.objects_changed(sandbox_names)

    def objects_changed(self, sandbox_names: frozenset[str] | None) -> None:
        """The cached Sandboxes named (None: any) or their pods changed: a claim still resolving
        its chain to one of them may find it in the cache now (see `_attempts`). Only those are
        woken: at 30-45 creates/s up to 32 claims resolve at once, and each pool member's pod and
        Sandbox change ~20 times per create, so waking every one re-opened each claim's proof for
        changes of other members."""
        for record in self._running:
            if record.wake is None or record.pod is not None:
                continue
            if sandbox_names is None or claims.bound_sandbox_name(record.claim) in sandbox_names:
                record.wake.set()

    def registrations_changed(self) -> None:
        """Wake the claims a registration change may be for: running ones backing off with their
        pod held here now (or not resolved yet), and parked ones whose pod is held here now."""
        holds = self._activator.holds
        for record in self._running:
            if record.wake is not None and (record.pod is None or holds(record.pod)):
                record.wake.set()
        for pod in [pod for pod in self._parked if holds(pod)]:
            self._consider(self._parked[pod], registration=True)

    def replace(self, items: list[Obj]) -> None:
        """The claims are now exactly `items` (a listing): forget the others, consider each.
        Before `start` (or after `aclose`) they are recorded only."""
        current = {str(c["metadata"].get("uid") or ""): c for c in items}
        for uid in self._claims.keys() - current.keys():
            self._forget(uid)
        for record in [self._record(uid, claim) for uid, claim in current.items()]:
            self._consider(record)

    def _record(self, uid: str, claim: Obj) -> _Claim:
        record = self._claims.get(uid)
        if record is None:
            record = self._claims[uid] = _Claim(uid, claim)
        record.claim = claim
        return record

    def _forget(self, uid: str) -> None:
        record = self._claims.pop(uid, None)
        if record is None:
            return
        self._unpark(record)
        if record.task is not None:
            record.task.cancel()
            record.task = None
            self._running.discard(record)

    def _park(self, record: _Claim, target: Target) -> None:
        self._unpark(record)
        record.parked = target
        self._parked[target.pod_uid] = record

    def _unpark(self, record: _Claim) -> None:
        if record.parked is not None and self._parked.get(record.parked.pod_uid) is record:
            del self._parked[record.parked.pod_uid]
        record.parked = None

    # -- scheduling --------------------------------------------------------------------------

    def _consider(self, record: _Claim, *, registration: bool = False) -> None:
        if self._stopped or self._claims.get(record.uid) is not record or record.done or record.task is not None:
            return
        if not claims.bound_sandbox_name(record.claim):
            return
        if record.parked is not None and not registration:
            return  # only a new registration can be its supervisor
        if len(self._running) >= self._max:
            if not record.waiting:
                log.debug("claim activations saturated (%d in flight); claim %s waits", self._max, record.uid)
            record.waiting = True
            return
        record.waiting = False
        record.wake = asyncio.Event()
        record.task = asyncio.create_task(self._activate(record, record.claim), name=f"k8s-claim:{record.uid}")
        self._running.add(record)

    def _finished(self, record: _Claim, task: asyncio.Task[None] | None) -> None:
        if record.task is task:
            record.task, record.wake = None, None
            self._running.discard(record)
        for waiting in [c for c in self._claims.values() if c.waiting]:
            if len(self._running) >= self._max:
                break
            waiting.waiting = False
            # A parked claim waits for a slot only when a registration woke it: it keeps that.
            self._consider(waiting, registration=waiting.parked is not None)

    async def _activate(self, record: _Claim, claim: Obj) -> None:
        name = f"{claim['metadata'].get('namespace')}/{claim['metadata'].get('name')}"
        task = asyncio.current_task()
        try:
            await self._attempts(record, name, claim)
        finally:
            self._finished(record, task)

    async def _attempts(self, record: _Claim, name: str, claim: Obj) -> None:
        target = parked = record.parked
        self._unpark(record)
        delays = (None,) if parked else (*RETRY_DELAYS, None)
        for attempt, delay in enumerate(delays):
            try:
                if parked is None and (attempt > 0 or len(delays) == 1):
                    target = await resolve_target(self._api, self._sealer, claim, self._cache)
                elif parked is None:
                    # The claim's status often lands before the informers see its Sandbox adopted:
                    # the first attempt waits for them rather than reading the Sandbox and pod
                    # live, two GETs per warm create.
                    target = await self._cached_target(record, claim)
                if target is not None:
                    record.pod = target.pod_uid
                    if not target.bound_us:  # kept when the attempt fails: parked with it
                        target = self._bound(target)
                    await self._activate_target(target, name)
                    record.done = True
                    return
            except AlreadyExistsError:
                record.done = True  # activated already (it registered bound after adoption)
                return
            except NotFoundError:
                woken = record.wake is not None and record.wake.is_set()  # a registration meanwhile
                if target is not None and not woken:
                    # Not registered here: not yet, or (replicas) on another gateway, whose own
                    # controller activates it. Parked, it is retried only on a registration here.
                    break
            except (ConflictError, UnavailableError, kube.Temporary):
                pass  # replaced meanwhile, or the API hiccuped: try again
            except WarmshellError as exc:
                record.done = True
                where = f"sandbox {target.sandbox_name}, pod {target.pod_name}" if target else "unresolved"
                log.warning("claim %s: activation given up (%s): %s", name, where, exc)
                return
            if delay is None:
                break
            if record.wake is not None:
                # Backoff between attempts; a registration change may be this pod's, so it ends it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(record.wake.wait(), delay)
                record.wake.clear()
        self._unresolved(record, name, claim, target, parked=parked is not None, attempts=len(delays))

    async def _cached_target(self, record: _Claim, claim: Obj) -> Target | None:
        """The claim's chain once the informers hold it, re-checked on each change they see (or a
        registration) for up to `CACHE_WAIT_SECONDS`; None if they do not by then. Only the cache
        is read: the same uid checks as a live read, and nothing refused on cached objects."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CACHE_WAIT_SECONDS
        while True:
            target = await resolve_target(self._api, self._sealer, claim, self._cache, live=False)
            if target is not None or record.wake is None or loop.time() >= deadline:
                return target
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(record.wake.wait(), deadline - loop.time())
            record.wake.clear()

    def _bound(self, target: Target) -> Target:
        """The moment this controller first found the claim bound (the timeline's claimed_us)."""
        return dataclasses.replace(target, bound_us=now_us())

    async def _activate_target(self, target: Target, name: str) -> None:
        await self._activator.activate(
            instance_id=target.pod_uid,
            sandbox_id=target.sandbox_id,
            proof=target.proof,
            reason=f"SandboxClaim/{name}",
            claimed_us=target.bound_us,
        )
        # Said by the replica that activated it alone (every replica resolves the claim), and
        # passed to the others' watchers like its other progress lines.
        line = ProgressLine("Claimed", "agent-sandbox bound the SandboxClaim to a warm Sandbox")
        self._hub.publish(DriverEvent(target.sandbox_id, progress=line))
        log.debug("claim %s: activated pod %s", name, target.pod_name)

    def _unresolved(
        self, record: _Claim, name: str, claim: Obj, target: Target | None, *, parked: bool, attempts: int
    ) -> None:
        """Out of attempts: park a known pod until a registration, or say once that none was found."""
        if target is not None:
            self._park(record, target)
            if not parked:
                log.debug(
                    "claim %s: the supervisor of pod %s (sandbox %s) is not registered here; "
                    "activating it when it registers",
                    name,
                    target.pod_name,
                    target.sandbox_name,
                )
            return
        if not record.warned:  # the resync retries it; once is enough to diagnose it
            record.warned = True
            log.warning(
                "claim %s: bound to Sandbox %s but its pod was not found after %d attempts; retrying on resync",
                name,
                claims.bound_sandbox_name(claim),
                attempts,
            )
