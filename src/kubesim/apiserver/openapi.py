"""The OpenAPI documents: ``/openapi/v3`` (an index), ``/openapi/v3/<api|apis/group>/<version>`` and
``/openapi/v2``, for every served resource including custom ones (their CRD schemas).

What clients read of them: kubectl and Helm's validator look, per GroupVersionKind, for the PATCH
operation (``x-kubernetes-group-version-kind``) and whether it takes the ``fieldValidation`` query
parameter; if so they leave validation to the server (``?fieldValidation=Strict``), which kubesim
does (``rest``). ``kubectl explain`` reads the schemas. Documents are rebuilt when the registry
changes (a CRD is added or removed); the index links each group-version with a content hash, so
kubectl's disk cache never serves a stale one.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from kubesim.apiserver import builtin_schemas, discovery
from kubesim.apiserver.resources import Registry, ResourceType

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
# Strategic merge is accepted by the server but not advertised: the models carry no patch merge
# keys, so a client that trusted these schemas for SMP would replace lists it should merge.
# Without it kubectl computes strategic patches from its compiled-in types, as it should.
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")
_WRITE_PARAMS = (
    ("dryRun", "When present, indicates that modifications should not be persisted."),
    ("fieldManager", "A name associated with the actor or entity that is making these changes."),
    ("fieldValidation", "How the server treats unknown or duplicate fields: Ignore, Warn or Strict."),
)
_FORCE = ("force", "Force is going to 'force' Apply requests (re-acquire conflicting fields).")


@dataclass
class _Operation:
    method: str
    action: str
    kind: str
    definition: str | None
    params: tuple[tuple[str, str], ...] = ()
    body: bool = False
    patch: bool = False


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _custom_definition_name(rt: ResourceType, version: str, kind: str) -> str:
    # Upstream names CRD models by the reversed group: agents.x-k8s.io → io.x-k8s.agents.
    return ".".join([*reversed(rt.group.split(".")), version, kind])


def _gvk(group: str, version: str, kind: str) -> dict[str, str]:
    return {"group": group, "version": version, "kind": kind}


def _kind_definitions(rt: ResourceType, version: str) -> dict[str, dict[str, Any]]:
    """The definitions of a resource's kind and its list kind, with their GVK extensions."""
    defs = builtin_schemas.definitions()
    out: dict[str, dict[str, Any]] = {}
    if rt.custom:
        raw = rt.versions[version].openapi_schema
        schema: dict[str, Any] = (
            copy.deepcopy(raw) if raw else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        )
        props: dict[str, Any] = schema.setdefault("properties", {})
        props["apiVersion"] = {"type": "string", "description": "APIVersion of this representation of an object."}
        props["kind"] = {"type": "string", "description": "Kind is a string value representing the REST resource."}
        props["metadata"] = {"$ref": f"#/definitions/{OBJECT_META}"}
        kind_name = _custom_definition_name(rt, version, rt.kind)
        list_name = _custom_definition_name(rt, version, rt.list_kind)
        list_schema: dict[str, Any] = {
            "type": "object",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"$ref": f"#/definitions/{LIST_META}"},
                "items": {"type": "array", "items": {"$ref": f"#/definitions/{kind_name}"}},
            },
        }
    else:
        found = builtin_schemas.kind_definition(rt.group, version, rt.kind)
        if found is None:
            return out
        kind_name, schema = found, copy.deepcopy(defs[found])
        listed = builtin_schemas.kind_definition(rt.group, version, rt.list_kind)
        list_name, list_schema = (listed, copy.deepcopy(defs[listed])) if listed else ("", {})
    schema["x-kubernetes-group-version-kind"] = [_gvk(rt.group, version, rt.kind)]
    out[kind_name] = schema
    if list_name:
        list_schema["x-kubernetes-group-version-kind"] = [_gvk(rt.group, version, rt.list_kind)]
        out[list_name] = list_schema
    return out


def _paths(rt: ResourceType, version: str, kind_def: str | None, list_def: str | None) -> dict[str, Any]:
    """Path items of one resource: collection, item and status; operations per served verb."""
    base = "/" + _gv_path(rt.group, version)
    collection = f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{base}/{rt.plural}"
    item = collection + "/{name}"
    verbs = set(rt.verbs)
    kind = rt.kind
    ops: dict[str, list[_Operation]] = {collection: [], item: []}
    if "list" in verbs:
        ops[collection].append(_Operation("get", "list", kind, list_def))
    if "create" in verbs:
        ops[collection].append(_Operation("post", "post", kind, kind_def, _WRITE_PARAMS, body=True))
    if "deletecollection" in verbs:
        ops[collection].append(_Operation("delete", "deletecollection", kind, STATUS))
    if "get" in verbs:
        ops[item].append(_Operation("get", "get", kind, kind_def))
    if "update" in verbs:
        ops[item].append(_Operation("put", "put", kind, kind_def, _WRITE_PARAMS, body=True))
    if "patch" in verbs:
        ops[item].append(_Operation("patch", "patch", kind, kind_def, (*_WRITE_PARAMS, _FORCE), body=True, patch=True))
    if "delete" in verbs:
        ops[item].append(_Operation("delete", "delete", kind, STATUS))
    if "status" in rt.subresources:
        ops[item + "/status"] = [
            _Operation("get", "get", kind, kind_def),
            _Operation("put", "put", kind, kind_def, _WRITE_PARAMS, body=True),
            _Operation("patch", "patch", kind, kind_def, (*_WRITE_PARAMS, _FORCE), body=True, patch=True),
        ]
    out: dict[str, Any] = {}
    for path, operations in ops.items():
        if not operations:
            continue
        entry: dict[str, Any] = {"parameters": _path_params(path)}
        for op in operations:
            entry[op.method] = _operation(rt, version, path, op)
        out[path] = entry
    return out


def _path_params(path: str) -> list[dict[str, Any]]:
    params = []
    for name in ("name", "namespace"):
        if "{" + name + "}" in path:
            params.append({"name": name, "in": "path", "required": True, "description": f"{name} of the object"})
    params.append({"name": "pretty", "in": "query", "description": "If 'true', then the output is pretty printed."})
    return params


def _operation(rt: ResourceType, version: str, path: str, op: _Operation) -> dict[str, Any]:
    suffix = "Status" if path.endswith("/status") else ""
    scope = "Namespaced" if rt.namespaced and "{namespace}" in path else ""
    action = {"post": "create", "put": "replace", "get": "read", "deletecollection": "deleteCollection"}.get(
        op.action, op.action
    )
    out: dict[str, Any] = {
        "operationId": f"{action}{scope}{op.kind}{suffix}",
        "description": f"{op.action} {rt.kind}",
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": _gvk(rt.group, version, rt.kind),
        "parameters": [{"name": n, "in": "query", "description": d, "uniqueItems": True} for n, d in op.params],
        "responses": {"200": {"description": "OK", "schema": op.definition}},
    }
    if op.body:
        out["requestBody"] = {"patch" if op.patch else "object": op.definition}
    return out


def _v3_operation(op: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in op.items() if k not in ("parameters", "responses", "requestBody")}
    out["parameters"] = [{**_no_type(p), "schema": {"type": "string"}} for p in op["parameters"]]
    definition = op["responses"]["200"]["schema"]
    content = {"application/json": {"schema": {"$ref": _ref(definition)}}} if definition else {}
    out["responses"] = {"200": {"description": "OK", "content": content}}
    body = op.get("requestBody")
    if body is not None:
        if "patch" in body:
            media = {t: {"schema": {"type": "object"}} for t in PATCH_TYPES}
        else:
            media = {"*/*": {"schema": {"$ref": _ref(body["object"])}}} if body["object"] else {}
        out["requestBody"] = {"content": media, "required": True}
    return out


def _v2_operation(op: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in op.items() if k not in ("parameters", "responses", "requestBody")}
    params: list[dict[str, Any]] = [{**p, "type": "string"} for p in op["parameters"]]
    body = op.get("requestBody")
    if body is not None:
        if "patch" in body:
            out["consumes"] = list(PATCH_TYPES)
            schema: dict[str, Any] = {"type": "object"}
        else:
            out["consumes"] = ["*/*"]
            schema = {"$ref": _ref(body["object"])} if body["object"] else {"type": "object"}
        params.insert(0, {"name": "body", "in": "body", "required": True, "schema": schema})
    out["parameters"] = params
    out["produces"] = ["application/json", "application/yaml"]
    definition = op["responses"]["200"]["schema"]
    response: dict[str, Any] = {"description": "OK"}
    if definition:
        response["schema"] = {"$ref": _ref(definition)}
    out["responses"] = {"200": response}
    return out


def _no_type(param: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in param.items() if k != "type"}


def _ref(definition: str) -> str:
    return f"#/definitions/{definition}"


def _to_v2_schema(schema: Any) -> Any:
    """Swagger 2.0 has no anyOf or preserve-unknown: int-or-string becomes a string format, as upstream."""
    if not isinstance(schema, dict):
        return schema
    if schema.get("x-kubernetes-int-or-string"):
        return {"type": "string", "format": "int-or-string", "x-kubernetes-int-or-string": True}
    out = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf", "not", "nullable")}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _to_v2_schema(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _to_v2_schema(out[key])
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_to_v2_schema(v) for v in out["allOf"]]
    return out


class OpenApi:
    """Builds and caches the documents for one registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._generation = -1
        self._v3: dict[str, bytes] = {}
        self._hashes: dict[str, str] = {}
        self._v2: dict[str, Any] | None = None

    def _groups(self) -> dict[tuple[str, str], list[ResourceType]]:
        out: dict[tuple[str, str], list[ResourceType]] = {}
        for rt in self.registry.all():
            for version in rt.versions:
                out.setdefault((rt.group, version), []).append(rt)
        return out

    def _parts(self, rts: list[ResourceType], version: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(paths, definitions incl. every built-in definition they reach) of one group-version."""
        paths: dict[str, Any] = {}
        defs: dict[str, Any] = {}
        for rt in rts:
            kinds = _kind_definitions(rt, version)
            defs.update(kinds)
            names = list(kinds)
            paths.update(_paths(rt, version, names[0] if names else None, names[1] if len(names) > 1 else None))
        builtin = builtin_schemas.definitions()
        wanted = builtin_schemas.references(defs) | builtin_schemas.references(paths) | {STATUS}
        for name in builtin_schemas.closure(wanted, builtin):
            defs.setdefault(name, builtin[name])
        return paths, defs

    def _refresh(self) -> None:
        if self._generation == self.registry.generation:
            return
        self._v3, self._hashes, self._v2 = {}, {}, None
        for (group, version), rts in self._groups().items():
            paths, defs = self._parts(rts, version)
            doc = {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": discovery.VERSION["gitVersion"]},
                "paths": {
                    p: {
                        k: (_v3_operation(v) if k != "parameters" else [_v3_param(x) for x in v])
                        for k, v in item.items()
                    }
                    for p, item in paths.items()
                },
                "components": {"schemas": defs},
            }
            body = json.dumps(doc, separators=(",", ":")).replace('"#/definitions/', '"#/components/schemas/').encode()
            key = _gv_path(group, version)
            self._v3[key] = body
            self._hashes[key] = hashlib.sha512(body).hexdigest().upper()[:128]
        self._generation = self.registry.generation

    def v3_index(self) -> dict[str, Any]:
        """``/openapi/v3``: every group-version's document, linked with its content hash."""
        self._refresh()
        return {
            "paths": {
                key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"} for key, digest in self._hashes.items()
            }
        }

    def v3_document(self, key: str) -> tuple[bytes, str] | None:
        """The (JSON, hash) of ``/openapi/v3/<key>`` (``api/v1``, ``apis/apps/v1``), if served."""
        self._refresh()
        body = self._v3.get(key)
        return None if body is None else (body, self._hashes[key])

    def v2_document(self) -> dict[str, Any]:
        """``/openapi/v2``: one Swagger 2.0 document for everything."""
        self._refresh()
        if self._v2 is None:
            paths: dict[str, Any] = {}
            defs: dict[str, Any] = {}
            for (_, version), rts in self._groups().items():
                p, d = self._parts(rts, version)
                for path, item in p.items():
                    paths[path] = {k: (_v2_operation(v) if k != "parameters" else v) for k, v in item.items()}
                    for param in paths[path]["parameters"]:
                        param["type"] = "string"
                defs.update(d)
            self._v2 = {
                "swagger": "2.0",
                "info": {"title": "Kubernetes", "version": discovery.VERSION["gitVersion"]},
                "paths": paths,
                "definitions": {name: _to_v2_schema(s) for name, s in defs.items()},
            }
        return self._v2


def _v3_param(param: dict[str, Any]) -> dict[str, Any]:
    return {**param, "schema": {"type": "string"}}
