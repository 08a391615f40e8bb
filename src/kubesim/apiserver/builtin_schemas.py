"""OpenAPI definitions of the built-in kinds, derived once from kubernetes_asyncio's generated models.

The Python client is generated from the Kubernetes OpenAPI document, so its models carry every
field of every built-in type (``openapi_types`` + ``attribute_map``). Turning them back into
definitions gives the OpenAPI documents (``openapi``) their built-in schemas and the write path
what Go's strict decoding knows: which fields exist (``prune_unknown``). Types are not checked
here — the real server's typed decoders are stricter than kubesim needs to be.
"""

from __future__ import annotations

import functools
import re
from typing import Any

Definitions = dict[str, dict[str, Any]]

_VERSION = re.compile(r"V\d+(?:alpha\d+|beta\d+)?(?=[A-Z])")
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(str, (.+)\)$")
_SCALARS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer", "format": "int64"},
    "float": {"type": "number", "format": "double"},
    "bool": {"type": "boolean"},
    "datetime": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
}
# Fields the models type as ``object`` that are IntOrString in the API.
_INT_OR_STRING = {"port", "targetPort", "maxSurge", "maxUnavailable", "minAvailable"}
# Meta types live in apimachinery, not k8s.io/api: keep upstream's definition names for them.
_APIMACHINERY = {
    "ObjectMeta",
    "ListMeta",
    "LabelSelector",
    "LabelSelectorRequirement",
    "OwnerReference",
    "ManagedFieldsEntry",
    "Condition",
    "Status",
    "StatusDetails",
    "StatusCause",
    "DeleteOptions",
    "Preconditions",
    "APIResource",
    "APIResourceList",
    "APIGroup",
    "APIGroupList",
    "APIVersions",
    "GroupVersionForDiscovery",
    "ServerAddressByClientCIDR",
    "WatchEvent",
}


def definition_name(model: str) -> str:
    """``V1PodSpec`` → ``io.k8s.api.v1.PodSpec``; ``CoreV1Event`` → ``io.k8s.api.core.v1.Event``;
    meta types get upstream's ``io.k8s.apimachinery.pkg.apis.meta.v1.*`` names."""
    if model.startswith("IoK8sApimachineryPkgApisMetaV1"):
        return "io.k8s.apimachinery.pkg.apis.meta.v1." + model[len("IoK8sApimachineryPkgApisMetaV1") :]
    m = _VERSION.search(model)
    if m is None:
        return "io.k8s.api." + model
    group, version, name = model[: m.start()].lower(), m.group(0).lower(), model[m.end() :]
    if not group and version == "v1" and name in _APIMACHINERY:
        return f"io.k8s.apimachinery.pkg.apis.meta.v1.{name}"
    return ".".join(p for p in ("io.k8s.api", group, version, name) if p)


@functools.cache
def _models() -> dict[str, type]:
    import kubernetes_asyncio.client.models as models  # heavy (~0.4 s): loaded on first use only

    return {n: c for n, c in vars(models).items() if isinstance(c, type) and hasattr(c, "openapi_types")}


def _property(type_name: str, json_name: str, models: dict[str, type]) -> dict[str, Any]:
    if type_name in _SCALARS:
        return dict(_SCALARS[type_name])
    if type_name == "object":
        if json_name in _INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if m := _LIST.match(type_name):
        return {"type": "array", "items": _property(m.group(1), "", models)}
    if m := _DICT.match(type_name):
        return {"type": "object", "additionalProperties": _property(m.group(1), "", models)}
    if type_name in models:
        return {"$ref": f"#/definitions/{definition_name(type_name)}"}
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


@functools.cache
def definitions() -> Definitions:
    """Every model as a v2 definition (``$ref: #/definitions/<name>``), keyed by definition name."""
    models = _models()
    out: Definitions = {}
    for model, cls in models.items():
        types: dict[str, str] = cls.openapi_types  # type: ignore[attr-defined]
        names: dict[str, str] = cls.attribute_map  # type: ignore[attr-defined]
        props = {names[attr]: _property(t, names[attr], models) for attr, t in types.items()}
        # The models' docstrings are the generator's boilerplate, not the API's field docs.
        out[definition_name(model)] = {"type": "object", "properties": props}
    return out


def _group_prefix(group: str) -> str:
    first = group.split(".")[0] if group else "core"
    return first[:1].upper() + first[1:]


def kind_definition(group: str, version: str, kind: str) -> str | None:
    """The definition name of a built-in kind (``apps``, ``v1``, ``Deployment``), if the models have it."""
    models = _models_by_name()
    ver = version[:1].upper() + version[1:]
    for candidate in (f"{_group_prefix(group)}{ver}{kind}", f"{ver}{kind}"):
        if candidate in models:
            return definition_name(candidate)
    return None


@functools.cache
def _models_by_name() -> frozenset[str]:
    return frozenset(_models())


def references(schema: Any) -> set[str]:
    """Definition names a schema refers to directly."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                found.add(ref.rsplit("/", 1)[-1])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def closure(roots: set[str], defs: Definitions) -> set[str]:
    """``roots`` and every definition they reach through ``$ref``."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        todo.extend(references(defs[name]))
    return seen


def prune_unknown(
    obj: Any, definition: str, defs: Definitions | None = None, *, old: dict[str, Any] | None = None
) -> list[str]:
    """Delete the fields of ``obj`` that ``definition`` does not declare (recursively) and return
    their paths (``spec.containers[0].foo``), as Go's strict JSON decoding would report them.

    ``old``: the stored object this one replaces, pruned by the same definition when it was
    written; values equal to its (a field, or an array item at the same index) hold nothing to
    prune and are not walked again (a pod's status write then skips its spec and the container
    statuses that did not change)."""
    found: list[str] = []
    schema = {"$ref": f"#/definitions/{definition}"}
    _walk(obj, schema, "", defs if defs is not None else definitions(), found, _MISSING if old is None else old)
    return found


_MISSING: Any = object()


def _walk(value: Any, schema: dict[str, Any], path: str, defs: Definitions, found: list[str], old: Any) -> None:
    ref = schema.get("$ref")
    if ref is not None:
        target = defs.get(ref.rsplit("/", 1)[-1])
        if target is not None:
            _walk(value, target, path, defs, found, old)
        return
    if isinstance(value, list) and "items" in schema:
        old_items = old if isinstance(old, list) else ()
        for i, item in enumerate(value):
            if i < len(old_items) and old_items[i] == item:
                continue
            _walk(item, schema["items"], f"{path}[{i}]", defs, found, _MISSING)
        return
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    old_fields: dict[str, Any] = old if isinstance(old, dict) else {}
    for key in list(value):
        old_child = old_fields.get(key, _MISSING)
        if old_child is not _MISSING and old_child == value[key]:
            continue
        sub = props.get(key) if props is not None else None
        if sub is None and isinstance(extra, dict):
            sub = extra
        child = f"{path}.{key}" if path else key
        if sub is None:
            if props is not None:
                del value[key]
                found.append(child)
            continue
        _walk(value[key], sub, child, defs, found, old_child)
