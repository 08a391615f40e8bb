"""CustomResourceDefinitions: validate a CRD, compile its schemas and turn it into a ResourceType.

Served versions share one stored object; serving another version only rewrites ``apiVersion``
(conversion strategy ``None`` semantics). The agent-sandbox CRDs declare a conversion webhook,
which kubesim does not call — the v1alpha1 and v1beta1 shapes of those kinds differ only in fields
our clients never send at v1alpha1.
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver import meta
from kubesim.apiserver.resources import ResourceType, VersionInfo
from kubesim.apiserver.schema import FieldError, compile_schema


def _err(field: str, reason: str, message: str) -> FieldError:
    return {"field": field, "reason": reason, "message": message}


def validate(crd: dict[str, Any]) -> list[FieldError]:
    """The CRD checks clients run into: names, scope, versions, one storage version."""
    errs: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    if not group:
        errs.append(_err("spec.group", "FieldValueRequired", "Required value"))
    for key in ("plural", "kind"):
        if not names.get(key):
            errs.append(_err(f"spec.names.{key}", "FieldValueRequired", "Required value"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errs.append(
            _err(
                "spec.scope",
                "FieldValueNotSupported",
                f'Unsupported value: "{spec.get("scope", "")}": supported values: "Cluster", "Namespaced"',
            )
        )
    expected = f"{names.get('plural', '')}.{group}"
    if crd["metadata"].get("name") != expected:
        errs.append(
            _err(
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{crd["metadata"].get("name")}": must be spec.names.plural+"."+spec.group',
            )
        )
    versions = spec.get("versions") or []
    if not versions:
        errs.append(
            _err(
                "spec.versions",
                "FieldValueInvalid",
                "Invalid value: null: must have exactly one version marked as storage version",
            )
        )
    elif sum(1 for v in versions if v.get("storage")) != 1:
        errs.append(
            _err(
                "spec.versions",
                "FieldValueInvalid",
                "Invalid value: []apiextensions.CustomResourceDefinitionVersion(nil): must have "
                "exactly one version marked as storage version",
            )
        )
    return errs


def to_resource(crd: dict[str, Any]) -> ResourceType:
    """Compile a (valid) CRD into the resource it serves."""
    spec = crd["spec"]
    names = spec["names"]
    versions: dict[str, VersionInfo] = {}
    storage = ""
    subresources: set[str] = set()
    scale: dict[str, str] | None = None
    for v in spec["versions"]:
        if v.get("storage"):
            storage = v["name"]
        if not v.get("served", True):
            continue
        raw_schema = (v.get("schema") or {}).get("openAPIV3Schema")
        versions[v["name"]] = VersionInfo(
            name=v["name"],
            schema=compile_schema(raw_schema) if raw_schema else None,
            openapi_schema=raw_schema or None,
            deprecated=bool(v.get("deprecated")),
            deprecation_warning=v.get("deprecationWarning")
            or f"{spec['group']}/{v['name']} {names['kind']} is deprecated",
            printer_columns=list(v.get("additionalPrinterColumns") or []),
        )
        sub = v.get("subresources") or {}
        if "status" in sub:
            subresources.add("status")
        if "scale" in sub:
            subresources.add("scale")
            scale = dict(sub["scale"])
    return ResourceType(
        group=spec["group"],
        plural=names["plural"],
        kind=names["kind"],
        singular=names.get("singular") or names["kind"].lower(),
        namespaced=spec.get("scope") == "Namespaced",
        versions=versions,
        storage_version=storage,
        short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []),
        subresources=tuple(sorted(subresources)),
        scale=scale,
        custom=True,
        list_kind=names.get("listKind") or names["kind"] + "List",
    )


def established_status(crd: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """The status a real server converges to: names accepted, established, stored versions."""
    spec = crd["spec"]
    storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
    stored = list((previous or {}).get("status", {}).get("storedVersions") or [])
    if storage not in stored:
        stored.append(storage)
    ts = meta.now()
    conditions = [
        {
            "type": "NamesAccepted",
            "status": "True",
            "reason": "NoConflicts",
            "message": "no conflicts found",
            "lastTransitionTime": ts,
        },
        {
            "type": "Established",
            "status": "True",
            "reason": "InitialNamesAccepted",
            "message": "the initial names have been accepted",
            "lastTransitionTime": ts,
        },
    ]
    if previous is not None:
        conditions = previous.get("status", {}).get("conditions") or conditions
    return {"conditions": conditions, "acceptedNames": dict(spec["names"]), "storedVersions": stored}
