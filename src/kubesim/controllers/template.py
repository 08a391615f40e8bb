"""The SandboxTemplate controller (notes §9): stamp the template-ref hash label on every template and
manage its shared NetworkPolicy ``<template>-network-policy`` (``Managed``: created/updated with the
template's rules or the secure default; ``Unmanaged``: deleted). kubesim stores NetworkPolicies but
nothing enforces them, since pod processes share the host network.
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers import client as kc
from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers.hashing import name_hash
from kubesim.controllers.informer import Informer, Key
from kubesim.controllers.workqueue import WorkQueue
from kubesim.timing import Timing

Obj = dict[str, Any]


def network_policy_spec(template: Obj) -> Obj:
    """The desired NetworkPolicy spec: custom rules, else ``buildDefaultNetworkPolicySpec``."""
    selector = {"matchLabels": {L.TEMPLATE_REF_HASH: name_hash(o.name_of(template))}}
    custom = template.get("spec", {}).get("networkPolicy")
    if custom is not None:
        spec: Obj = {"podSelector": selector, "policyTypes": ["Ingress", "Egress"]}
        if custom.get("ingress") is not None:
            spec["ingress"] = custom["ingress"]
        if custom.get("egress") is not None:
            spec["egress"] = custom["egress"]
        return spec
    router = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
        "podSelector": {"matchLabels": {"app": "sandbox-router"}},
    }
    private_v4 = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]
    return {
        "podSelector": selector,
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [router]}],
        "egress": [
            {
                "to": [
                    {"ipBlock": {"cidr": "0.0.0.0/0", "except": private_v4}},
                    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
                ]
            }
        ],
    }


class TemplateController:
    def __init__(self, api: kc.KubeClient, *, templates: Informer, timing: Timing) -> None:
        self._api = api
        self._templates = templates
        self.queue: WorkQueue[Key] = WorkQueue(
            "sandboxtemplate", self.reconcile, workers=4, delay=timing.reconcile_delay
        )
        templates.add_handler(self._on_template)

    def _on_template(self, etype: str, obj: Obj, old: Obj | None) -> None:
        if etype != "DELETED":
            self.queue.add((o.namespace_of(obj), o.name_of(obj)))

    async def reconcile(self, key: Key) -> float | None:
        template = self._templates.get(*key)
        if template is None or o.is_deleting(template):
            return None
        want = name_hash(o.name_of(template))
        if o.labels_of(template).get(L.TEMPLATE_REF_HASH) != want:
            patch = {"metadata": {"labels": {L.TEMPLATE_REF_HASH: want}}}
            try:
                await self._api.patch(kc.TEMPLATES, key[0], key[1], patch)
            except kc.ApiError as exc:
                if not exc.not_found:
                    raise
        await self._reconcile_network_policy(template)
        return None

    async def _reconcile_network_policy(self, template: Obj) -> None:
        ns, name = o.namespace_of(template), f"{o.name_of(template)}-network-policy"
        managed = (template.get("spec", {}).get("networkPolicyManagement") or "Managed") == "Managed"
        try:
            existing: Obj | None = await self._api.get(kc.NETWORKPOLICIES, ns, name)
        except kc.ApiError as exc:
            if not exc.not_found:
                raise
            existing = None
        owned = existing is not None and o.is_controlled_by(existing, o.uid_of(template))
        if not managed:
            if existing is not None and owned:
                await self._api.delete(kc.NETWORKPOLICIES, ns, name, uid=o.uid_of(existing))
            return
        spec = network_policy_spec(template)
        if existing is None:
            body = {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": [o.owner_reference(template)]},
                "spec": spec,
            }
            try:
                await self._api.create(kc.NETWORKPOLICIES, ns, body)
            except kc.ApiError as exc:
                if not exc.already_exists:
                    raise
        elif not owned:
            raise RuntimeError(f"refusing to update NetworkPolicy {name!r}: not controlled by the template")
        elif existing.get("spec") != spec:
            existing["spec"] = spec
            await self._api.update(kc.NETWORKPOLICIES, existing)
