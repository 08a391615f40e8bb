"""The claim activation controller: when agent-sandbox binds one of our SandboxClaims to a warm
Sandbox, activate the supervisor already registered from that Sandbox's pod.

Triggers: a watch on our labelled claims, a relist every 15 s (a missed event costs at most that),
and every change of the gateway's registrations (a pod that registers after its claim was bound).
Each claim is followed claim → `status.sandbox.name` → Sandbox (controller = the claim's uid) →
pod (controller = the Sandbox's uid); the sealed proof must open for (namespace, claim name,
sandbox id). Work is deduplicated by claim uid, at most 32 activations run at once, a supervisor
not registered yet is retried with backoff and then parked until a registration arrives (retrying a
parked claim is one in-memory call, no API reads), and every give-up is logged at warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    UnavailableError,
    WarmshellError,
)
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.core.models import now_us
from warmshell.drivers.base import Activator
from warmshell.drivers.kubernetes import claims, kube, labels, proofs, status, watching

__all__ = ["ClaimActivation", "ClaimRefused", "Target", "resolve_target"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RELIST_SECONDS = 15.0
MAX_IN_FLIGHT = 32
# Waits between attempts while the supervisor has not registered; then the claim waits quietly
# for the next registration change or relist.
RETRY_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


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


async def resolve_target(api: kube.Kube, sealer: proofs.ProofSealer, claim: Mapping[str, Any]) -> Target | None:
    """Follow a bound claim to its pod; None while it is not bound or the pod does not exist yet."""
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


class ClaimActivation:
    """Runs the triggers and the bounded, deduplicated activation tasks."""

    def __init__(
        self,
        api: kube.Kube,
        namespace: str,
        sealer: proofs.ProofSealer,
        activator: Activator,
        backoff: watching.Backoff,
        *,
        on_bound: Callable[[SandboxId], None] = lambda _id: None,
        on_activated: Callable[[SandboxId, InstanceId], None] = lambda _id, _pod: None,
        on_gone: Callable[[], None] = lambda: None,
        relist_seconds: float | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._sealer = sealer
        self._activator = activator
        self._backoff = backoff
        self._on_bound = on_bound
        self._on_activated = on_activated
        self._on_gone = on_gone  # a 404 on the claim collection: the extension CRDs were removed
        self._relist_seconds = relist_seconds or RELIST_SECONDS  # read late: tests shorten it
        self._max = max_in_flight
        self._claims: dict[str, Obj] = {}  # by uid
        self._done: set[str] = set()  # claim uids activated or given up
        self._running: dict[str, asyncio.Task[None]] = {}
        self._wake: dict[str, asyncio.Event] = {}  # cuts a running task's backoff short
        # Claims whose pod is known but not registered here after the backoff: tried again (one
        # in-memory call, no API reads) on each registration change. After a gateway restart this
        # holds every running warm sandbox, whose supervisors never register again.
        self._parked: dict[str, Target] = {}
        self._warned: set[str] = set()
        self._waiting: set[str] = set()  # not scheduled because of the bound; scheduled on a free slot
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the watch, the relist and the registration trigger."""
        self._tasks = [
            asyncio.create_task(self._watch(), name="k8s-claims:watch"),
            asyncio.create_task(self._relist_forever(), name="k8s-claims:relist"),
            asyncio.create_task(self._on_registrations(), name="k8s-claims:registrations"),
        ]

    async def aclose(self) -> None:
        """Stop everything, including activations in flight."""
        tasks = [*self._tasks, *self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks, self._running = [], {}

    # -- triggers ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        def listed(items: list[Obj]) -> None:
            self._replace(items)

        def changed(kind: str, claim: Obj) -> None:
            uid = str(claim["metadata"].get("uid") or "")
            if kind == "DELETED":
                self._forget(uid)
                return
            self._claims[uid] = claim
            self._consider(uid)

        try:
            await watching.follow(
                self._api,
                kube.SANDBOX_CLAIMS,
                self._namespace,
                label_selector=labels.claim_selector(),
                on_list=listed,
                on_event=changed,
                backoff=self._backoff,
            )
        except kube.NotFound:
            self._on_gone()  # the driver stops this controller, and starts a new one when they are back

    async def _relist_forever(self) -> None:
        while True:
            await asyncio.sleep(self._relist_seconds)  # a period, not a wait for a condition
            await self._relist_once()

    async def _relist_once(self) -> None:
        """Catch up with every claim (a watch may have missed events, or dropped)."""
        try:
            listing = await self._api.list(kube.SANDBOX_CLAIMS, self._namespace, label_selector=labels.claim_selector())
        except kube.NotFound:
            self._on_gone()  # said once, by the driver's extensions gate
            return
        except kube.ApiError as exc:
            log.warning("relist of SandboxClaims failed: %s", exc)
            return
        self._replace(list(listing.get("items") or []))

    async def _on_registrations(self) -> None:
        generation = 0
        while True:
            generation = await self._activator.wait_registrations_changed(generation)
            for event in self._wake.values():
                event.set()
            for uid in list(self._claims):
                self._consider(uid, registration=True)

    def _replace(self, items: list[Obj]) -> None:
        current = {str(c["metadata"].get("uid") or ""): c for c in items}
        for uid in self._claims.keys() - current.keys():
            self._forget(uid)
        self._claims = current
        for uid in current:
            self._consider(uid)

    def _forget(self, uid: str) -> None:
        self._claims.pop(uid, None)
        self._done.discard(uid)
        self._waiting.discard(uid)
        self._wake.pop(uid, None)
        self._parked.pop(uid, None)
        self._warned.discard(uid)
        task = self._running.pop(uid, None)
        if task is not None:
            task.cancel()

    # -- scheduling --------------------------------------------------------------------------

    def _consider(self, uid: str, *, registration: bool = False) -> None:
        claim = self._claims.get(uid)
        if claim is None or uid in self._done or uid in self._running or not claims.bound_sandbox_name(claim):
            return
        if uid in self._parked and not registration:
            return  # only a new registration can be its supervisor
        if len(self._running) >= self._max:
            if uid not in self._waiting:
                log.debug("claim activations saturated (%d in flight); claim %s waits", self._max, uid)
            self._waiting.add(uid)
            return
        self._waiting.discard(uid)
        self._wake[uid] = asyncio.Event()
        self._running[uid] = asyncio.create_task(self._activate(uid, claim), name=f"k8s-claim:{uid}")

    def _finished(self, uid: str, task: asyncio.Task[None] | None) -> None:
        if self._running.get(uid) is task:
            self._running.pop(uid, None)
            self._wake.pop(uid, None)
        if self._waiting and len(self._running) < self._max:
            self._consider(self._waiting.pop())

    async def _activate(self, uid: str, claim: Obj) -> None:
        name = f"{claim['metadata'].get('namespace')}/{claim['metadata'].get('name')}"
        task = asyncio.current_task()
        try:
            await self._attempts(uid, name, claim)
        finally:
            self._finished(uid, task)

    async def _attempts(self, uid: str, name: str, claim: Obj) -> None:
        target = parked = self._parked.pop(uid, None)
        delays = (None,) if parked else (*RETRY_DELAYS, None)
        for delay in delays:
            try:
                if parked is None:
                    target = await resolve_target(self._api, self._sealer, claim)
                if target is not None:
                    if not target.bound_us:
                        target = dataclasses.replace(target, bound_us=now_us())
                        self._on_bound(target.sandbox_id)
                    await self._activator.activate(
                        instance_id=target.pod_uid,
                        sandbox_id=target.sandbox_id,
                        proof=target.proof,
                        reason=f"SandboxClaim/{name}",
                        claimed_us=target.bound_us,
                    )
                    self._done.add(uid)
                    self._on_activated(target.sandbox_id, target.pod_uid)
                    log.debug("claim %s: activated pod %s", name, target.pod_name)
                    return
            except AlreadyExistsError:
                self._done.add(uid)  # activated already (it registered bound after adoption)
                return
            except (NotFoundError, ConflictError, UnavailableError, kube.Temporary):
                pass  # not registered yet, replaced meanwhile, or the API hiccuped: try again
            except WarmshellError as exc:
                self._done.add(uid)
                where = f"sandbox {target.sandbox_name}, pod {target.pod_name}" if target else "unresolved"
                log.warning("claim %s: activation given up (%s): %s", name, where, exc)
                return
            if delay is None:
                break
            wake = self._wake.get(uid)
            if wake is not None:
                # Backoff between attempts; a registration change may be this pod's, so it ends it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                wake.clear()
        if target is not None:
            self._parked[uid] = target
            if parked is None:
                log.info(
                    "claim %s: the supervisor of pod %s (sandbox %s) is not registered here; "
                    "activating it when it registers",
                    name,
                    target.pod_name,
                    target.sandbox_name,
                )
            return
        if uid not in self._warned:  # the relist retries it; once is enough to diagnose it
            self._warned.add(uid)
            log.warning(
                "claim %s: bound to Sandbox %s but its pod was not found after %d attempts; retrying on relist",
                name,
                claims.bound_sandbox_name(claim),
                len(delays),
            )
