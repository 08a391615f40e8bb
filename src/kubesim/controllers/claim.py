"""The SandboxClaim controller: bind each claim to a warm Sandbox from its pool, or create a cold
one named like the claim, then mirror the Sandbox's readiness into the claim (notes §11).

Exclusivity: a candidate is popped from an in-memory per-pool FIFO (so concurrent reconciles here
never pick the same one) and adopted with a merge patch carrying the Sandbox's resourceVersion, so
even two controllers racing could not both adopt it — the API server lets exactly one write win.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubesim.controllers import candidates
from kubesim.controllers import claims as C
from kubesim.controllers import client as kc
from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers.events import Recorder
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]
log = logging.getLogger(__name__)

_ADOPTION_ATTEMPTS = 3


class ClaimController:
    def __init__(
        self,
        api: kc.KubeClient,
        *,
        claims: Informer,
        sandboxes: Informer,
        pools_informer: Informer,
        templates: Informer,
        timing: Timing,
        events: Recorder,
        workers: int = 50,
    ) -> None:
        self._api = api
        self.events = events
        self._claims = claims
        self._sandboxes = sandboxes
        self._pools = pools_informer
        self._templates = templates
        self._timing = timing
        self.warm = candidates.WarmQueue()
        self._first_seen: dict[str, float] = {}
        self._own = o.OwnWrites()
        #: Sandboxes this controller wrote (adoptions); a bound claim ignores older cached copies.
        self.sandbox_writes = o.OwnWrites()
        self.queue: WorkQueue[Key] = WorkQueue(
            "sandboxclaim", self.reconcile, workers=workers, delay=timing.reconcile_delay
        )
        claims.add_handler(self._on_claim)
        sandboxes.add_handler(self._on_sandbox)
        pools_informer.add_handler(self._on_pool_or_template)
        templates.add_handler(self._on_pool_or_template)

    # -- event routing ---------------------------------------------------------------------------
    def _on_claim(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype == "DELETED":
            self._first_seen.pop(o.uid_of(obj), None)
            self._own.forget(o.uid_of(obj))
            return
        self._first_seen.setdefault(o.uid_of(obj), asyncio.get_running_loop().time())
        self.queue.add((o.namespace_of(obj), o.name_of(obj)))

    def _on_sandbox(self, etype: str, obj: Obj, old: Obj | None) -> None:
        self.warm.observe(etype, obj)
        ref = o.controller_ref(obj)
        if ref and ref.get("kind") == "SandboxClaim":
            self.queue.add((o.namespace_of(obj), str(ref["name"])))

    def _on_pool_or_template(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype == "DELETED" and obj.get("kind") == "SandboxWarmPool":
            self.warm.drop_pool((o.namespace_of(obj), o.name_of(obj)))
        if etype == "ADDED":
            # A pool or template appearing may unblock claims that failed with *NotFound.
            for claim in self._claims.items(o.namespace_of(obj)):
                if not (claim.get("status") or {}).get("sandbox", {}).get("name"):
                    self.queue.add((o.namespace_of(claim), o.name_of(claim)))

    # -- reconcile -------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        claim = self._claims.get(*key)
        if claim is None or o.is_deleting(claim) or self._own.is_stale(claim):
            return None
        assigned = o.annotations_of(claim).get(L.CLAIM_SANDBOX_NAME)
        cached_sb = self._sandboxes.get(key[0], assigned) if assigned else None
        if cached_sb is not None and self.sandbox_writes.is_stale(cached_sb):
            return None  # we just adopted it; its watch event (owner: this claim) brings us back
        expire_at = C.expire_at(claim)
        now = o.now()
        if expire_at is not None and now >= expire_at:
            await self._reconcile_expired(claim)
            return None
        requeue: float | None = None
        if expire_at is not None:
            requeue = (expire_at - now).total_seconds()
        error: C.ClaimError | None = None
        sandbox: Obj | None = None
        try:
            sandbox, claim, wait = await self._get_or_create_sandbox(claim)
            if wait is not None:
                return wait  # warm candidates without IPs yet: no status write (upstream)
        except C.ClaimError as exc:
            error = exc
            if exc.reason in ("WarmPoolNotFound", "TemplateNotFound"):
                requeue = _min(requeue, self._timing.missing_ref_requeue)
            elif exc.reason in ("AdoptionConflict", "SandboxCreatePending", "ReconcilerError"):
                requeue = _min(requeue, 0.2)
        except kc.ApiError as exc:
            if exc.status == 409:
                raise  # our copy of the claim is stale: retry from the next event / backoff
            # Anything else the API refused (say, an invalid Sandbox) is shown on the claim.
            error = C.ClaimError("ReconcilerError", str(exc))
            requeue = _min(requeue, 1.0)
        await self._write_status(claim, sandbox, error=error, expired=False)
        return requeue

    async def _get_or_create_sandbox(self, claim: Obj) -> tuple[Obj | None, Obj, float | None]:
        ns, uid = o.namespace_of(claim), o.uid_of(claim)
        bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
        if bound:
            sb = self._sandboxes.get(ns, bound)
            if sb is not None and o.is_controlled_by(sb, uid) and not o.is_deleting(sb):
                return sb, claim, None
        assigned = o.annotations_of(claim).get(L.CLAIM_SANDBOX_NAME)
        if assigned:
            sb = self._sandboxes.get(ns, assigned)
            if sb is not None and o.is_controlled_by(sb, uid) and not o.is_deleting(sb):
                return sb, claim, None
            if sb is not None and candidates.candidate_for(claim, sb):
                template = self._template_for(claim)
                adopted = await self._patch_adoption(claim, sb, template)
                if adopted is not None:
                    return adopted, claim, None
            claim = await self._set_assignment(claim, None)
        same_name = self._sandboxes.get(ns, o.name_of(claim))
        if same_name is not None and not o.is_deleting(same_name):
            if o.is_controlled_by(same_name, uid):
                return same_name, claim, None
            raise C.ClaimError(
                "ReconcilerError",
                f'sandbox "{o.name_of(claim)}" is not controlled by claim "{o.name_of(claim)}"',
            )
        template = self._template_for(claim)
        if not C.forces_cold(claim):
            C.validate_additional_metadata(claim)
            adopted, claim, pending = await self._adopt_from_candidates(claim, template)
            if adopted is not None:
                return adopted, claim, None
            if pending:
                loop = asyncio.get_running_loop()
                age = loop.time() - self._first_seen.get(uid, loop.time())
                remaining = self._timing.warm_candidate_grace - age
                if remaining > 0:
                    return None, claim, min(self._timing.warm_candidate_retry, remaining)
        return await self._create_cold(claim, template), claim, None

    def _template_for(self, claim: Obj) -> Obj:
        ns = o.namespace_of(claim)
        pool = self._pools.get(ns, claim["spec"]["warmPoolRef"]["name"])
        if pool is None:
            raise C.warm_pool_not_found(claim)
        tname = (pool.get("spec", {}).get("sandboxTemplateRef") or {}).get("name", "")
        template = self._templates.get(ns, tname)
        if template is None:
            raise C.template_not_found(tname)
        return template

    def _pick(self, claim: Obj, template: Obj) -> tuple[Obj | None, bool]:
        ns = o.namespace_of(claim)
        pool = self._pools.get(ns, claim["spec"]["warmPoolRef"]["name"]) or {}
        recreate = (pool.get("spec", {}).get("updateStrategy") or {}).get("type") == "Recreate"
        return candidates.pick_candidate(
            self.warm, claim, template, lambda name: self._sandboxes.get(ns, name), recreate=recreate
        )

    async def _adopt_from_candidates(self, claim: Obj, template: Obj) -> tuple[Obj | None, Obj, bool]:
        pending = False
        for _ in range(_ADOPTION_ATTEMPTS):
            candidate, pending = self._pick(claim, template)
            if candidate is None:
                return None, claim, pending
            try:
                claim = await self._set_assignment(claim, o.name_of(candidate))
            except kc.ApiError as exc:
                self.warm.push((o.namespace_of(claim), claim["spec"]["warmPoolRef"]["name"]), o.name_of(candidate))
                if exc.conflict:
                    raise C.ClaimError(
                        "AdoptionConflict",
                        f"claim {o.name_of(claim)} changed during adoption; the next pass "
                        "retries from a converged view",
                    ) from exc
                raise
            adopted = await self._patch_adoption(claim, candidate, template)
            if adopted is not None:
                note = f'Adopted warm pool Sandbox "{o.name_of(adopted)}"'
                self.events.record(claim, type_="Normal", reason="SandboxAdopted", action="Adoption", note=note)
                return adopted, claim, False
            claim = await self._set_assignment(claim, None)
        return None, claim, pending

    async def _set_assignment(self, claim: Obj, sandbox_name: str | None) -> Obj:
        """Record (or clear) the assigned Sandbox on the claim with an optimistic-lock update."""
        body = o.deep(claim)
        annos = body["metadata"].setdefault("annotations", {})
        if sandbox_name is None:
            if L.CLAIM_SANDBOX_NAME not in annos:
                return claim
            del annos[L.CLAIM_SANDBOX_NAME]
        else:
            annos[L.CLAIM_SANDBOX_NAME] = sandbox_name
        body.pop("status", None)
        updated: Obj = await self._api.update(kc.CLAIMS, body)
        self._own.record(updated)
        return updated

    async def _patch_adoption(self, claim: Obj, sandbox: Obj, template: Obj) -> Obj | None:
        """The ownership swap; None when another writer won the Sandbox first."""
        ns, name = o.namespace_of(sandbox), o.name_of(sandbox)
        try:
            patch = C.adoption_patch(claim, sandbox, template)
            adopted: Obj = await self._api.patch(kc.SANDBOXES, ns, name, patch)
            self.sandbox_writes.record(adopted)
            return adopted
        except kc.ApiError as exc:
            if not (exc.conflict or exc.not_found):
                raise
        # Lost a race or read a stale copy: decide from the API's current view.
        try:
            current = await self._api.get(kc.SANDBOXES, ns, name)
        except kc.ApiError as exc:
            if exc.not_found:
                return None
            raise
        if o.is_controlled_by(current, o.uid_of(claim)):
            return current
        if candidates.candidate_for(claim, current):
            try:
                again: Obj = await self._api.patch(kc.SANDBOXES, ns, name, C.adoption_patch(claim, current, template))
                self.sandbox_writes.record(again)
                return again
            except kc.ApiError as exc:
                if not (exc.conflict or exc.not_found):
                    raise
        return None

    async def _create_cold(self, claim: Obj, template: Obj) -> Obj:
        body = C.cold_sandbox(claim, template)
        try:
            created: Obj = await self._api.create(kc.SANDBOXES, o.namespace_of(claim), body)
            note = f'Created Sandbox "{o.name_of(created)}"'
            self.events.record(claim, type_="Normal", reason="SandboxProvisioned", action="Provisioning", note=note)
            return created
        except kc.ApiError as exc:
            if exc.already_exists:
                raise C.ClaimError(
                    "SandboxCreatePending", "Sandbox already created; waiting for cache to converge"
                ) from exc
            raise

    async def _write_status(
        self, claim: Obj, sandbox: Obj | None, *, error: C.ClaimError | None, expired: bool
    ) -> None:
        bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
        if error is not None and error.reason == "SandboxCreatePending" and bound:
            return  # cache lag on our own create: keep the status as it is
        new = C.claim_status(claim, sandbox, error=error, expired=expired, at=o.now())
        old = claim.get("status") or {}
        if old == new:
            return
        patch_status: Obj = dict(new)
        if old.get("sandbox") and "sandbox" not in new:
            patch_status["sandbox"] = None
        patch = {
            "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
            "status": patch_status,
        }
        try:
            written = await self._api.patch(kc.CLAIMS, o.namespace_of(claim), o.name_of(claim), patch, sub="status")
            self._own.record(written)
        except kc.ApiError as exc:
            # A conflict means the claim moved on; its watch event brings us back here.
            if not (exc.conflict or exc.not_found):
                raise

    async def _reconcile_expired(self, claim: Obj) -> None:
        ns, name = o.namespace_of(claim), o.name_of(claim)
        ready = o.get_condition((claim.get("status") or {}).get("conditions"), "Ready")
        bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
        sandbox = self._sandboxes.get(ns, bound) if bound else None
        if ready is None or ready.get("reason") != "ClaimExpired":
            await self._write_status(claim, sandbox, error=None, expired=True)
            self.events.record(
                claim, type_="Normal", reason="ClaimExpired", action="Claim Expired", note="Claim expired"
            )
            self.queue.add_after((ns, name), 0.001)
            return
        policy = (claim.get("spec", {}).get("lifecycle") or {}).get("shutdownPolicy") or "Retain"
        try:
            if policy == "Delete":
                await self._api.delete(kc.CLAIMS, ns, name, uid=o.uid_of(claim))
                return
            if policy == "DeleteForeground":
                await self._api.delete(kc.CLAIMS, ns, name, uid=o.uid_of(claim), propagation="Foreground")
                return
            if sandbox is not None and o.is_controlled_by(sandbox, o.uid_of(claim)):
                if not o.is_deleting(sandbox):
                    await self._api.delete(kc.SANDBOXES, ns, bound, uid=o.uid_of(sandbox))
                return  # the Sandbox's DELETED event brings us back to clear status.sandbox
        except kc.ApiError as exc:
            if not (exc.not_found or exc.status == 409):
                raise
        await self._write_status(claim, None, error=None, expired=True)


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
