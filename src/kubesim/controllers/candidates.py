"""Warm candidates for claims (notes §11.1, §11.3): the per-pool FIFO of adoptable Sandboxes fed by
watch events, and ``getCandidate``'s choice among them. Pure: no I/O, no awaiting."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers import pools

Obj = dict[str, Any]


def is_adoptable(sandbox: Obj) -> bool:
    """``isAdoptable``: not deleting, pool labels present, controlled by a SandboxWarmPool."""
    if o.is_deleting(sandbox):
        return False
    sb_labels = o.labels_of(sandbox)
    if not sb_labels.get(L.WARM_POOL_SANDBOX) or not sb_labels.get(L.TEMPLATE_REF_HASH):
        return False
    ref = o.controller_ref(sandbox)
    return ref is not None and o.ref_group_kind(ref) == (L.EXT_GROUP, "SandboxWarmPool")


def candidate_for(claim: Obj, sandbox: Obj) -> bool:
    """``verifySandboxCandidate``: same namespace, adoptable, from the claim's pool."""
    ref = o.controller_ref(sandbox) or {}
    return (
        o.namespace_of(sandbox) == o.namespace_of(claim)
        and is_adoptable(sandbox)
        and ref.get("name") == claim["spec"]["warmPoolRef"]["name"]
    )


class WarmQueue:
    """Per-pool FIFO of adoptable Sandbox names, fed by Sandbox watch events."""

    def __init__(self) -> None:
        self._fifo: dict[tuple[str, str], collections.OrderedDict[str, None]] = {}

    def observe(self, etype: str, sandbox: Obj) -> None:
        ref = o.controller_ref(sandbox) or {}
        ns, name = o.namespace_of(sandbox), o.name_of(sandbox)
        adoptable = etype != "DELETED" and is_adoptable(sandbox)
        if adoptable:
            fifo = self._fifo.setdefault((ns, str(ref.get("name"))), collections.OrderedDict())
            if name not in fifo:
                fifo[name] = None
            return
        for (qns, _), fifo in self._fifo.items():
            if qns == ns:
                fifo.pop(name, None)

    def drop_pool(self, key: tuple[str, str]) -> None:
        self._fifo.pop(key, None)

    def pop(self, key: tuple[str, str]) -> str | None:
        fifo = self._fifo.get(key)
        if not fifo:
            return None
        name, _ = fifo.popitem(last=False)
        return name

    def push(self, key: tuple[str, str], name: str) -> None:
        self._fifo.setdefault(key, collections.OrderedDict())[name] = None

    def __len__(self) -> int:
        return sum(len(f) for f in self._fifo.values())


def pick_candidate(
    queue: WarmQueue,
    claim: Obj,
    template: Obj,
    lookup: Callable[[str], Obj | None],
    *,
    recreate: bool,
) -> tuple[Obj | None, bool]:
    """``getCandidate`` (notes §11.3): prefer a Ready member, else the first not-Ready one that has
    pod IPs; IP-less members go back to the queue and make the claim wait (the warm grace).

    Returns (candidate, whether IP-less candidates exist). Pops and pushes without yielding to the
    event loop, so two reconciles can never be handed the same Sandbox.
    """
    qkey = (o.namespace_of(claim), claim["spec"]["warmPoolRef"]["name"])
    pending: list[str] = []
    requeue: list[str] = []
    fallback: Obj | None = None
    chosen: Obj | None = None
    while (name := queue.pop(qkey)) is not None:
        sb = lookup(name)
        if sb is None or not candidate_for(claim, sb):
            continue  # gone or no longer adoptable: drop the key
        if recreate and pools.is_stale(sb, template):
            continue
        if not (sb.get("status") or {}).get("podIPs"):
            pending.append(name)
        elif o.condition_true(sb, "Ready"):
            chosen = sb
            break
        elif fallback is None:
            fallback = sb
        else:
            requeue.append(name)
    if chosen is None:
        chosen = fallback
    elif fallback is not None:
        requeue.append(o.name_of(fallback))
    for name in requeue + pending:
        queue.push(qkey, name)
    return chosen, bool(pending)
