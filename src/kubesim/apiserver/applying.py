"""Server-side apply, approximated: ownership is tracked per Apply manager in ``managedFields``.

What it does like upstream: applying merges the configuration into the live object (maps
recursively, keyed lists by their merge key, other lists atomically); fields a manager applied
before and omits now are removed unless another manager owns them; a field owned by a different
Apply manager with a different value is a 409 conflict unless ``force=true``. What it leaves out:
fields written by Update operations are not tracked as owned (see ``managedFields`` notes in the
final report), so they never conflict with an apply.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kubesim.apiserver import errors, meta
from kubesim.apiserver.patching import MERGE_KEYS

Path = tuple[str, ...]
_SKIP_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
}


def _key_token(item: dict[str, Any], key: str) -> str:
    return "k:" + json.dumps({key: item[key]}, separators=(",", ":"))


def field_paths(obj: Any, prefix: Path = (), parent: str = "") -> set[Path]:
    """Leaf field paths of an applied configuration, in fieldsV1 token form."""
    out: set[Path] = set()
    if isinstance(obj, dict) and (obj or not prefix):
        for k, v in obj.items():
            if not prefix and k in ("apiVersion", "kind"):
                continue
            if prefix == ("f:metadata",) and k in _SKIP_META:
                continue
            out |= field_paths(v, (*prefix, f"f:{k}"), k)
        return out
    if isinstance(obj, list) and parent in MERGE_KEYS:
        key = MERGE_KEYS[parent]
        for item in obj:
            if isinstance(item, dict) and key in item:
                tok = (*prefix, _key_token(item, key))
                out.add(tok)
                out |= field_paths(item, tok, "")
        return out or {prefix}
    out.add(prefix)
    return out


def to_fields_v1(paths: set[Path]) -> dict[str, Any]:
    """Nest paths into the FieldsV1 JSON form (``{"f:spec": {"f:replicas": {}}}``)."""
    root: dict[str, Any] = {}
    for path in paths:
        cur = root
        for tok in path:
            cur = cur.setdefault(tok, {})
    return root


def from_fields_v1(fields: dict[str, Any], prefix: Path = ()) -> set[Path]:
    """Inverse of ``to_fields_v1``: the leaf paths of a FieldsV1 tree."""
    out: set[Path] = set()
    for tok, sub in fields.items():
        if tok == ".":
            continue
        path = (*prefix, tok)
        if sub:
            out |= from_fields_v1(sub, path)
            if tok.startswith("k:"):
                out.add(path)
        else:
            out.add(path)
    return out


def _lookup(obj: Any, path: Path) -> tuple[bool, Any]:
    cur = obj
    for tok in path:
        if tok.startswith("f:") and isinstance(cur, dict):
            name = tok[2:]
            if name not in cur:
                return False, None
            cur = cur[name]
        elif tok.startswith("k:") and isinstance(cur, list):
            want = json.loads(tok[2:])
            found = [x for x in cur if isinstance(x, dict) and all(x.get(k) == v for k, v in want.items())]
            if not found:
                return False, None
            cur = found[0]
        else:
            return False, None
    return True, cur


def _remove(obj: Any, path: Path) -> None:
    parent_ok, parent = _lookup(obj, path[:-1])
    if not parent_ok:
        return
    tok = path[-1]
    if tok.startswith("f:") and isinstance(parent, dict):
        parent.pop(tok[2:], None)
    elif tok.startswith("k:") and isinstance(parent, list):
        want = json.loads(tok[2:])
        parent[:] = [x for x in parent if not (isinstance(x, dict) and all(x.get(k) == v for k, v in want.items()))]


def _merge(live: Any, applied: Any, parent: str = "") -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        for k, v in applied.items():
            out[k] = _merge(live.get(k), v, k)
        return out
    if isinstance(live, list) and isinstance(applied, list) and parent in MERGE_KEYS:
        key = MERGE_KEYS[parent]
        out_list = list(live)
        for item in applied:
            if not isinstance(item, dict) or key not in item:
                return copy.deepcopy(applied)
            idx = next((i for i, x in enumerate(out_list) if isinstance(x, dict) and x.get(key) == item[key]), None)
            if idx is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[idx] = _merge(out_list[idx], item)
        return out_list
    return copy.deepcopy(applied)


def _entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("metadata", {}).get("managedFields") or [])


def apply(
    live: dict[str, Any] | None,
    applied: dict[str, Any],
    *,
    manager: str,
    force: bool,
    api_version: str,
) -> dict[str, Any]:
    """Return the object after applying ``applied`` as ``manager`` (raises 409 on conflicts)."""
    if not manager:
        raise errors.bad_request("PATCH, application/apply-patch+yaml requires fieldManager to be set")
    new_paths = field_paths(applied)
    base = copy.deepcopy(live) if live is not None else {}
    entries = _entries(base)
    mine = next((e for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"), None)
    old_paths = from_fields_v1(mine.get("fieldsV1") or {}) if mine else set()
    others: dict[Path, str] = {}
    for e in entries:
        if e is mine or e.get("operation") != "Apply":
            continue
        for p in from_fields_v1(e.get("fieldsV1") or {}):
            others[p] = e["manager"]
    if live is not None and not force:
        conflicts = []
        for p in sorted(new_paths):
            owner = others.get(p)
            if owner is None:
                continue
            _, cur = _lookup(live, p)
            _, want = _lookup(applied, p)
            if cur != want:
                conflicts.append((owner, p))
        if conflicts:
            raise _conflict_error(applied, conflicts)
    merged: dict[str, Any] = _merge(base, applied)
    for p in old_paths - new_paths:
        if p not in others:
            _remove(merged, p)
    if force:
        # Forced fields change hands: other Apply managers lose them.
        for e in entries:
            if e is not mine and e.get("operation") == "Apply":
                kept = from_fields_v1(e.get("fieldsV1") or {}) - new_paths
                e["fieldsV1"] = to_fields_v1(kept)
        entries = [e for e in entries if e is mine or e.get("operation") != "Apply" or e.get("fieldsV1")]
    entry = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": meta.now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(new_paths),
    }
    entries = [e for e in entries if e is not mine] + [entry]
    merged.setdefault("metadata", {})["managedFields"] = entries
    return merged


def _conflict_error(applied: dict[str, Any], conflicts: list[tuple[str, Path]]) -> errors.ApiError:
    n = len(conflicts)
    if n == 1:
        owner, path = conflicts[0]
        message = f'Apply failed with 1 conflict: conflict with "{owner}": .{_dotted(path)}'
    else:
        lines = "\n".join(f'- conflict with "{o}": .{_dotted(p)}' for o, p in conflicts)
        message = f"Apply failed with {n} conflicts:\n{lines}"
    causes = [
        {"reason": "FieldManagerConflict", "message": f'conflict with "{o}"', "field": "." + _dotted(p)}
        for o, p in conflicts
    ]
    name = applied.get("metadata", {}).get("name", "")
    return errors.ApiError(409, "Conflict", message, details={"name": name, "causes": causes})


def _dotted(path: Path) -> str:
    return ".".join(t[2:] if t.startswith("f:") else f"[{t[2:]}]" for t in path)
