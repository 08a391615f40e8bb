"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge follows k8s.io/apimachinery/pkg/util/strategicpatch for the core kinds kubesim
serves: lists listed in ``MERGE_KEYS`` merge by key, ``$patch`` (replace/delete/merge),
``$deleteFromPrimitiveList/…``, ``$setElementOrder/…`` and ``$retainKeys`` directives.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.apiserver import errors

# patchMergeKey of the list-valued fields with patchStrategy "merge" in the core types we serve.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "secrets": "name",
    "podIPs": "ip",
}
# Lists of scalars with patchStrategy "merge" (set semantics).
MERGE_PRIMITIVES = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces. The result
    takes ``patch``'s values as they are (no copy): callers pass a patch decoded for this request
    alone, which nothing reads afterwards."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- JSON patch --------------------------------------------------------------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise errors.ApiError(422, "Invalid", f"invalid JSON pointer: {path}")
    return [_unescape(p) for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise errors.ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: "
                f'doc is missing path: "{path}": missing value',
            )
    return cur


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise errors.ApiError(422, "Invalid", f'doc is missing path: "{path}": missing value')


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise errors.ApiError(422, "Invalid", f'add operation does not apply: doc is missing path: "{path}"')
    else:
        raise errors.ApiError(422, "Invalid", f'add operation does not apply: doc is missing path: "{path}"')
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise errors.ApiError(422, "Invalid", f'remove operation does not apply: doc is missing path: "{path}"')
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """Apply an RFC 6902 operation list to a copy of ``doc``."""
    if not isinstance(ops, list):
        raise errors.bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise errors.bad_request(f"invalid json patch operation: {op!r}")
        kind = op["op"]
        path = op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _remove(doc, path) if _pointer(path) else doc
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise errors.ApiError(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: testing value {path} failed",
                )
        else:
            raise errors.bad_request(f"unexpected json patch operation {kind!r}")
    return doc


# ---- strategic merge patch ---------------------------------------------------------------------


def strategic_merge(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch for core kinds (see module docstring)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in MERGE_PRIMITIVES:
            merged = list(result.get(key) or [])
            merged += [v for v in value if v not in merged]
            result[key] = merged
        elif isinstance(value, dict):
            merged_child = strategic_merge(result.get(key), value)
            if merged_child is None:
                result.pop(key, None)
            else:
                result[key] = merged_child
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = [copy.deepcopy(item) for item in current]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            result.append(copy.deepcopy(item))
            continue
        idx = next(
            (i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
            continue
        if idx is None:
            result.append(strategic_merge({}, item))
        else:
            result[idx] = strategic_merge(result[idx], item)
    return result
