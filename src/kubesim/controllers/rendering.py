"""Pure rendering for the Sandbox controller: the Pod (and headless Service) a Sandbox owns.

Mirrors upstream ``sandbox_controller.go``: system-prefixed keys never travel from the pod template
to the Pod; the Pod gets the name-hash label, the "extension" labels when a pool or claim controls
the Sandbox, a normalised ``created-by``, and ``propagated-*`` annotations that remember which
template keys were copied (so they can be removed later). The pod spec is never touched again.
"""

from __future__ import annotations

from typing import Any

from kubesim.controllers import labels as L
from kubesim.controllers import objects as o
from kubesim.controllers.hashing import name_hash

Obj = dict[str, Any]


def extension_pod_labels(sandbox: Obj) -> dict[str, str]:
    """``computeExtensionPodLabels``: labels taken from the Sandbox when an extension owns it."""
    ref = o.controller_ref(sandbox)
    if ref is None:
        return {}
    group, kind = o.ref_group_kind(ref)
    if group != L.EXT_GROUP:
        return {}
    sb_labels = o.labels_of(sandbox)
    out: dict[str, str] = {}
    if kind == "SandboxWarmPool" and sb_labels.get(L.WARM_POOL_SANDBOX):
        out[L.WARM_POOL_SANDBOX] = sb_labels[L.WARM_POOL_SANDBOX]
    if sb_labels.get(L.TEMPLATE_REF_HASH):
        out[L.TEMPLATE_REF_HASH] = sb_labels[L.TEMPLATE_REF_HASH]
    return out


def _template_meta(sandbox: Obj) -> tuple[dict[str, str], dict[str, str]]:
    tmeta = sandbox.get("spec", {}).get("podTemplate", {}).get("metadata") or {}
    t_labels = {k: v for k, v in (tmeta.get("labels") or {}).items() if not L.is_system_key(k)}
    t_annos = {k: v for k, v in (tmeta.get("annotations") or {}).items() if not L.is_system_annotation(k)}
    return t_labels, t_annos


def desired_pod_metadata(sandbox: Obj) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations the Pod of ``sandbox`` must carry."""
    t_labels, t_annos = _template_meta(sandbox)
    pod_labels = dict(t_labels)
    pod_labels[L.SANDBOX_NAME_HASH] = name_hash(o.name_of(sandbox))
    pod_labels.update(extension_pod_labels(sandbox))
    created_by = o.labels_of(sandbox).get(L.CREATED_BY)
    if created_by:
        pod_labels[L.CREATED_BY] = L.normalize_created_by(created_by)
    annos = dict(t_annos)
    if t_labels:
        annos[L.PROPAGATED_LABELS] = ",".join(sorted(t_labels))
    if t_annos:
        annos[L.PROPAGATED_ANNOTATIONS] = ",".join(sorted(t_annos))
    return pod_labels, annos


def render_pod(sandbox: Obj) -> Obj:
    """The Pod created for a Running Sandbox with no Pod (name = Sandbox name)."""
    pod_labels, annos = desired_pod_metadata(sandbox)
    spec = o.deep(sandbox.get("spec", {}).get("podTemplate", {}).get("spec") or {})
    vcts = sandbox.get("spec", {}).get("volumeClaimTemplates") or []
    if vcts:
        # PVC-backed volumes replace same-named template volumes, as upstream does.
        pvc_names = {v["metadata"]["name"] for v in vcts}
        volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in pvc_names]
        for vct in vcts:
            vname = vct["metadata"]["name"]
            claim = f"{vname}-{o.name_of(sandbox)}"
            volumes.append({"name": vname, "persistentVolumeClaim": {"claimName": claim}})
        spec["volumes"] = volumes
    metadata: Obj = {
        "name": o.name_of(sandbox),
        "namespace": o.namespace_of(sandbox),
        "labels": pod_labels,
        "ownerReferences": [o.owner_reference(sandbox)],
    }
    if annos:
        metadata["annotations"] = annos
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pod_metadata_patch(sandbox: Obj, pod: Obj) -> Obj | None:
    """Merge patch that repairs an existing Pod's metadata (``updatePodMetadata``), or None.

    Keys copied earlier but gone from the template are removed (tracked through the
    ``propagated-*`` annotations), extension labels no longer expected are removed (the
    ``warm-pool-sandbox`` label once a claim adopts the Sandbox), ``created-by`` follows the Sandbox.
    """
    want_labels, want_annos = desired_pod_metadata(sandbox)
    have_labels, have_annos = o.labels_of(pod), o.annotations_of(pod)
    label_patch: dict[str, str | None] = {}
    anno_patch: dict[str, str | None] = {}
    for key in _split(have_annos.get(L.PROPAGATED_LABELS)):
        if key not in want_labels and key in have_labels and not L.is_system_key(key):
            label_patch[key] = None
    for key in (L.WARM_POOL_SANDBOX, L.TEMPLATE_REF_HASH, L.CREATED_BY):
        if key not in want_labels and key in have_labels:
            label_patch[key] = None
    for key, value in want_labels.items():
        if have_labels.get(key) != value:
            label_patch[key] = value
    for key in _split(have_annos.get(L.PROPAGATED_ANNOTATIONS)):
        if key not in want_annos and key in have_annos and not L.is_system_annotation(key):
            anno_patch[key] = None
    for key in (L.PROPAGATED_LABELS, L.PROPAGATED_ANNOTATIONS):
        if key not in want_annos and key in have_annos:
            anno_patch[key] = None
    for key, value in want_annos.items():
        if have_annos.get(key) != value:
            anno_patch[key] = value
    if not label_patch and not anno_patch:
        return None
    patch_meta: Obj = {}
    if label_patch:
        patch_meta["labels"] = label_patch
    if anno_patch:
        patch_meta["annotations"] = anno_patch
    return {"metadata": patch_meta}


def _split(value: str | None) -> list[str]:
    return [k for k in (value or "").split(",") if k]


def render_service(sandbox: Obj) -> Obj:
    """Headless Service named as the Sandbox, selecting its Pod by name hash."""
    hash_label = {L.SANDBOX_NAME_HASH: name_hash(o.name_of(sandbox))}
    spec = sandbox.get("spec", {}).get("podTemplate", {}).get("spec") or {}
    ports: list[Obj] = []
    seen: set[tuple[int, str]] = set()
    for container in spec.get("containers") or []:
        for cport in container.get("ports") or []:
            number, proto = int(cport["containerPort"]), str(cport.get("protocol") or "TCP")
            if (number, proto) in seen:
                continue
            seen.add((number, proto))
            pname = cport.get("name") or f"p-{number}-{proto.lower()}"
            ports.append({"name": pname, "port": number, "targetPort": number, "protocol": proto})
    svc_spec: Obj = {"clusterIP": "None", "selector": hash_label}
    if ports:
        svc_spec["ports"] = ports
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": o.name_of(sandbox),
            "namespace": o.namespace_of(sandbox),
            "labels": dict(hash_label),
            "ownerReferences": [o.owner_reference(sandbox)],
        },
        "spec": svc_spec,
    }


def render_pvcs(sandbox: Obj) -> list[Obj]:
    """The PersistentVolumeClaims of a Sandbox's ``volumeClaimTemplates``."""
    out: list[Obj] = []
    hash_label = {L.SANDBOX_NAME_HASH: name_hash(o.name_of(sandbox))}
    for vct in sandbox.get("spec", {}).get("volumeClaimTemplates") or []:
        vmeta = vct.get("metadata") or {}
        metadata: Obj = {
            "name": f"{vmeta['name']}-{o.name_of(sandbox)}",
            "namespace": o.namespace_of(sandbox),
            "labels": {**(vmeta.get("labels") or {}), **hash_label},
            "ownerReferences": [o.owner_reference(sandbox)],
        }
        if vmeta.get("annotations"):
            metadata["annotations"] = dict(vmeta["annotations"])
        out.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": metadata,
                "spec": o.deep(vct.get("spec") or {}),
            }
        )
    return out
