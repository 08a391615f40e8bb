"""Pure decisions of the SandboxClaim controller (notes §11): the adoption patch, the cold Sandbox,
policy checks (env, additionalPodMetadata), the claim's Ready condition and its expiry."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers import pools
from kubesim.controllers.hashing import name_hash

Obj = dict[str, Any]

#: Default allow-list of label domains for ``additionalPodMetadata`` (upstream default).
ALLOWED_LABEL_DOMAINS = ("sandbox.users.io",)
_RESTRICTED_ANNOTATION_DOMAINS = ("kubernetes.io", "k8s.io", "agents.x-k8s.io")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


@dataclasses.dataclass
class ClaimError(Exception):
    """A reconcile failure with the claim Ready reason it maps to (upstream sentinel errors)."""

    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


def warm_pool_not_found(claim: Obj) -> ClaimError:
    pool = claim["spec"]["warmPoolRef"]["name"]
    return ClaimError("WarmPoolNotFound", f'SandboxWarmPool "{pool}" not found')


def template_not_found(name: str) -> ClaimError:
    return ClaimError("TemplateNotFound", f'SandboxTemplate "{name}" not found')


def forces_cold(claim: Obj) -> bool:
    spec = claim.get("spec", {})
    return bool(spec.get("env")) or bool(spec.get("volumeClaimTemplates"))


def validate_additional_metadata(claim: Obj) -> None:
    """``validateAdditionalPodMetadata`` (notes §11.8); raises ClaimError(InvalidMetadata)."""
    apm = claim.get("spec", {}).get("additionalPodMetadata") or {}
    for key, value in (apm.get("labels") or {}).items():
        _check_key(key, "label")
        if key == "app" and value == "sandbox-router":
            raise ClaimError(
                "InvalidMetadata",
                f'restricted system label value: "{key}"="{value}" is not allowed in AdditionalPodMetadata',
            )
        if "/" not in key:
            raise ClaimError(
                "InvalidMetadata",
                f"label \"{key}\" must have a domain prefix (e.g. 'sandbox.users.io/my-label') "
                "to prevent opting into unintended policy domains",
            )
        domain = key.split("/", 1)[0]
        if not any(domain == d or domain.endswith("." + d) for d in ALLOWED_LABEL_DOMAINS):
            raise ClaimError("InvalidMetadata", f'label domain "{domain}" is not in the allowlist')
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ClaimError("InvalidMetadata", f'invalid label value: "{value}"')
    for key in apm.get("annotations") or {}:
        _check_key(key, "annotation")
        if key == L.SAFE_TO_EVICT or "/" not in key:
            continue
        domain = key.split("/", 1)[0]
        if any(domain == d or domain.endswith("." + d) for d in _RESTRICTED_ANNOTATION_DOMAINS):
            raise ClaimError(
                "InvalidMetadata",
                f'restricted system domain: "{key}" is not allowed in AdditionalPodMetadata',
            )


def _check_key(key: str, kind: str) -> None:
    name = key.split("/", 1)[-1]
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        raise ClaimError("InvalidMetadata", f'invalid {kind} key: "{key}"')


def claimed_pod_metadata(claim: Obj, template: Obj) -> Obj:
    """``podTemplate.metadata`` of a claimed Sandbox: template metadata + claim-uid + template-ref
    hash + created-by + additionalPodMetadata ("No Overrides")."""
    tmeta = (template.get("spec", {}).get("podTemplate") or {}).get("metadata") or {}
    pt_labels = dict(tmeta.get("labels") or {})
    pt_annos = dict(tmeta.get("annotations") or {})
    apm = claim.get("spec", {}).get("additionalPodMetadata") or {}
    for kind, base, extra in (
        ("label", pt_labels, apm.get("labels") or {}),
        ("annotation", pt_annos, apm.get("annotations") or {}),
    ):
        for key, value in extra.items():
            if key in base and base[key] != value:
                raise ClaimError(
                    "ReconcilerError",
                    f'metadata override conflict: {kind} "{key}" is defined in template with '
                    f'value "{base[key]}", but claim requests "{value}"',
                )
            base[key] = value
    pt_labels[L.CLAIM_UID] = o.uid_of(claim)
    pt_labels[L.TEMPLATE_REF_HASH] = name_hash(o.name_of(template))
    created_by = o.labels_of(claim).get(L.CREATED_BY)
    if created_by:
        pt_labels[L.CREATED_BY] = created_by
    out: Obj = {"labels": pt_labels}
    if pt_annos:
        out["annotations"] = pt_annos
    return out


def adoption_patch(claim: Obj, sandbox: Obj, template: Obj) -> Obj:
    """Merge patch adopting a warm ``sandbox`` for ``claim`` (notes §11.4 step 2).

    It carries the Sandbox's resourceVersion, so the API server applies it only if nobody wrote the
    Sandbox since we read it: of two claims racing for one Sandbox exactly one wins.
    """
    sb_labels = o.labels_of(sandbox)
    label_patch: dict[str, str | None] = {
        L.WARM_POOL_SANDBOX: None,
        L.TEMPLATE_HASH: None,
        L.POD_TEMPLATE_HASH: None,
        L.LAUNCH_TYPE: "warm",
        L.CLAIM_UID: o.uid_of(claim),
        L.TEMPLATE_REF_HASH: sb_labels.get(L.TEMPLATE_REF_HASH) or name_hash(o.name_of(template)),
    }
    label_patch[L.CREATED_BY] = o.labels_of(claim).get(L.CREATED_BY)
    annos: dict[str, str | None] = {L.POD_NAME_ANNOTATION: o.name_of(sandbox)}
    trace = o.annotations_of(claim).get(L.TRACE_CONTEXT)
    if trace:
        annos[L.TRACE_CONTEXT] = trace
    # A merge patch replaces lists and merges maps, so podTemplate.metadata must spell out removals
    # (the pool hash labels and safe-to-evict) to end up *replaced*, as upstream's update does.
    new_meta = claimed_pod_metadata(claim, template)
    old_meta = sandbox.get("spec", {}).get("podTemplate", {}).get("metadata") or {}
    pt_meta: Obj = {}
    for field in ("labels", "annotations"):
        old_map: dict[str, str] = old_meta.get(field) or {}
        new_map: dict[str, str] = new_meta.get(field) or {}
        merged: dict[str, str | None] = {k: None for k in old_map if k not in new_map}
        merged.update(new_map)
        if merged:
            pt_meta[field] = merged
    return {
        "metadata": {
            "resourceVersion": sandbox["metadata"]["resourceVersion"],
            "labels": label_patch,
            "annotations": annos,
            "ownerReferences": [o.owner_reference(claim)],
        },
        "spec": {"podTemplate": {"metadata": pt_meta}},
    }


def cold_sandbox(claim: Obj, template: Obj) -> Obj:
    """The Sandbox a claim creates when nothing warm is usable: named exactly like the claim."""
    validate_additional_metadata(claim)
    spec = pools.blueprint(template)
    ptmeta = spec["podTemplate"].get("metadata") or {}
    ptmeta.update(claimed_pod_metadata(claim, template))
    spec["podTemplate"]["metadata"] = ptmeta
    pod_spec = spec["podTemplate"].setdefault("spec", {})
    _inject_env(claim, template, pod_spec)
    _merge_vcts(claim, template, spec)
    pools.apply_secure_defaults(pod_spec, template)
    sb_labels = {
        L.CLAIM_UID: o.uid_of(claim),
        L.LAUNCH_TYPE: "cold",
        L.TEMPLATE_REF_HASH: name_hash(o.name_of(template)),
    }
    created_by = o.labels_of(claim).get(L.CREATED_BY)
    if created_by:
        sb_labels[L.CREATED_BY] = created_by
    annos = {L.TEMPLATE_REF_ANNOTATION: o.name_of(template)}
    trace = o.annotations_of(claim).get(L.TRACE_CONTEXT)
    if trace:
        annos[L.TRACE_CONTEXT] = trace
    return {
        "apiVersion": L.SANDBOX_API_VERSION,
        "kind": "Sandbox",
        "metadata": {
            "name": o.name_of(claim),
            "namespace": o.namespace_of(claim),
            "labels": sb_labels,
            "annotations": annos,
            "ownerReferences": [o.owner_reference(claim)],
        },
        "spec": spec,
    }


def _inject_env(claim: Obj, template: Obj, pod_spec: Obj) -> None:
    env = claim.get("spec", {}).get("env") or []
    if not env:
        return
    policy = template.get("spec", {}).get("envVarsInjectionPolicy") or "Disallowed"
    if policy == "Disallowed":
        raise ClaimError(
            "EnvVarsInjectionRejected",
            "environment variable injection is not allowed by the template policy",
        )
    containers = pod_spec.get("containers") or []
    for item in env:
        target = item.get("containerName")
        matches = [c for c in containers if c.get("name") == target] if target else containers[:1]
        if not matches:
            raise ClaimError(
                "ReconcilerError",
                f'Error seen: target container "{target}" not found in template for environment '
                f'variable "{item["name"]}"',
            )
        container = matches[0]
        if policy == "Allowed" and container.get("envFrom"):
            raise ClaimError(
                "EnvVarsInjectionRejected",
                f'container "{container.get("name")}" uses EnvFrom sources; Allowed policy cannot '
                "safely prevent overriding EnvFrom-provided variables",
            )
        cenv: list[Obj] = container.setdefault("env", [])
        existing = [e for e in cenv if e.get("name") == item["name"]]
        if existing and policy == "Allowed":
            raise ClaimError(
                "EnvVarsInjectionRejected",
                f'environment variable override is not allowed by the template policy for variable "{item["name"]}"',
            )
        cenv[:] = [e for e in cenv if e.get("name") != item["name"]]
        cenv.append({"name": item["name"], "value": item.get("value", "")})


def _merge_vcts(claim: Obj, template: Obj, spec: Obj) -> None:
    vcts = claim.get("spec", {}).get("volumeClaimTemplates") or []
    if not vcts:
        return
    policy = template.get("spec", {}).get("volumeClaimTemplatesPolicy") or "Disallowed"
    if policy == "Disallowed":
        raise ClaimError(
            "VolumeClaimTemplatesError",
            "claim: volume claim templates are not allowed by the template policy",
        )
    base: list[Obj] = list(spec.get("volumeClaimTemplates") or [])
    names = [v.get("metadata", {}).get("name") for v in base]
    for vct in vcts:
        vname = vct.get("metadata", {}).get("name")
        if not vname:
            raise ClaimError("VolumeClaimTemplatesError", "claim: name at index is empty")
        if vname in names:
            if policy != "Overrides":
                raise ClaimError("VolumeClaimTemplatesError", f'cannot override template volume "{vname}"')
            base = [v for v in base if v.get("metadata", {}).get("name") != vname]
        base.append(o.deep(vct))
        names.append(vname)
    spec["volumeClaimTemplates"] = base


def ready_condition(claim: Obj, sandbox: Obj | None, *, error: ClaimError | None, expired: bool) -> Obj:
    """``computeReadyCondition``: errors, expiry, else the Sandbox's Ready forwarded verbatim."""
    gen = int(claim.get("metadata", {}).get("generation") or 0)

    def cond(reason: str, message: str) -> Obj:
        return {
            "type": "Ready",
            "status": "False",
            "reason": reason,
            "message": message,
            "observedGeneration": gen,
        }

    if error is not None:
        if error.reason == "ReconcilerError" and not error.message.startswith("Error seen: "):
            return cond(error.reason, "Error seen: " + error.message)
        return cond(error.reason, error.message)
    if expired:
        return cond("ClaimExpired", "Claim expired. Sandbox cleanup initiated.")
    if sandbox is None:
        return cond("SandboxMissing", "Sandbox does not exist")
    sb_ready = o.get_condition(sandbox.get("status", {}).get("conditions"), "Ready")
    if sb_ready is not None and sb_ready.get("reason") == "SandboxExpired":
        return cond("SandboxExpired", "Underlying Sandbox resource has expired independently of the Claim.")
    if sb_ready is not None:
        forwarded = dict(sb_ready)
        forwarded["observedGeneration"] = gen
        return forwarded
    return cond("SandboxNotReady", "Sandbox is not ready")


def claim_status(
    claim: Obj,
    sandbox: Obj | None,
    *,
    error: ClaimError | None,
    expired: bool,
    at: datetime.datetime,
) -> Obj:
    """The claim's whole desired status (written in one patch)."""
    old = claim.get("status") or {}
    conds: list[Obj] = list(old.get("conditions") or [])
    ready = ready_condition(claim, sandbox, error=error, expired=expired)
    conds = [c for c in conds if c.get("type") != "Ready"]
    old_ready = o.get_condition(old.get("conditions"), "Ready")
    if "lastTransitionTime" not in ready:
        if old_ready is not None and old_ready.get("status") == ready["status"]:
            ready["lastTransitionTime"] = old_ready.get("lastTransitionTime")
        else:
            ready["lastTransitionTime"] = o.rfc3339(at)
    conds.append(ready)
    finished = None
    if sandbox is not None:
        finished = o.get_condition(sandbox.get("status", {}).get("conditions"), "Finished")
    conds = [c for c in conds if c.get("type") != "Finished"]
    if finished is not None:
        mirrored = dict(finished)
        mirrored["observedGeneration"] = ready["observedGeneration"]
        conds.append(mirrored)
    conds.sort(key=lambda c: str(c.get("type")))
    status: Obj = {"conditions": conds}
    if sandbox is not None:
        sb_status: Obj = {"name": o.name_of(sandbox)}
        ips = sandbox.get("status", {}).get("podIPs")
        if ips:
            sb_status["podIPs"] = list(ips)
        status["sandbox"] = sb_status
    elif error is not None and old.get("sandbox"):
        # Never clear the bound identity on an error: it would force a cold start next pass.
        status["sandbox"] = old["sandbox"]
    return status


def expire_at(claim: Obj) -> datetime.datetime | None:
    """``min(lifecycle.shutdownTime, Finished.lastTransitionTime + ttlSecondsAfterFinished)``."""
    lifecycle = claim.get("spec", {}).get("lifecycle") or {}
    candidates: list[datetime.datetime] = []
    shutdown = o.parse_time(lifecycle.get("shutdownTime"))
    if shutdown is not None:
        candidates.append(shutdown)
    ttl = lifecycle.get("ttlSecondsAfterFinished")
    finished = o.get_condition(claim.get("status", {}).get("conditions"), "Finished")
    if ttl is not None and finished is not None and finished.get("status") == "True":
        ltt = o.parse_time(finished.get("lastTransitionTime"))
        if ltt is not None:
            candidates.append(ltt + datetime.timedelta(seconds=int(ttl)))
    return min(candidates) if candidates else None
