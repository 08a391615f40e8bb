"""The ``scale`` subresource of custom resources: an autoscaling/v1 ``Scale`` view over the
paths the CRD names (``specReplicasPath``, ``statusReplicasPath``, ``labelSelectorPath``)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from kubesim.apiserver import errors, patching
from kubesim.apiserver.resources import ResourceType
from kubesim.apiserver.store import Stored

if TYPE_CHECKING:
    from kubesim.apiserver.rest import Rest, Result, WriteOptions

JSON_PATCH = "application/json-patch+json"


def scale_of(rt: ResourceType, stored: Stored) -> dict[str, Any]:
    """The autoscaling/v1 Scale view of an object with a scale subresource."""
    assert rt.scale is not None
    m = stored.obj["metadata"]
    status: dict[str, Any] = {"replicas": _at(stored.obj, rt.scale.get("statusReplicasPath")) or 0}
    selector = _at(stored.obj, rt.scale.get("labelSelectorPath"))
    if selector:
        status["selector"] = selector
    keep = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: m[k] for k in keep if k in m},
        "spec": {"replicas": _at(stored.obj, rt.scale["specReplicasPath"]) or 0},
        "status": status,
    }


def update_scale(rest: Rest, rt: ResourceType, version: str, stored: Stored, scale: Any, opts: WriteOptions) -> Result:
    """PUT on /scale: set the spec replicas path, with the Scale's resourceVersion as precondition."""
    name = stored.obj["metadata"]["name"]
    if rt.scale is None or not isinstance(scale, dict):
        raise errors.not_found(rt.plural, rt.group, name)
    new = copy.deepcopy(stored.obj)
    _set_at(new, rt.scale["specReplicasPath"], (scale.get("spec") or {}).get("replicas"))
    rv = (scale.get("metadata") or {}).get("resourceVersion")
    new["metadata"]["resourceVersion"] = rv or stored.obj["metadata"]["resourceVersion"]
    ns = stored.obj["metadata"].get("namespace", "")
    result = rest.update(rt, version, ns, name, new, opts, is_patch=True)
    after = rest.store.get(rt.group, rt.plural, ns, name)
    result.obj = scale_of(rt, after or Stored(result.obj))
    return result


def patch_scale(
    rest: Rest, rt: ResourceType, version: str, stored: Stored, content_type: str, body: Any, opts: WriteOptions
) -> Result:
    """PATCH on /scale: patch the Scale view, then write it back like a PUT."""
    scale = scale_of(rt, stored)
    patched = patching.json_patch(scale, body) if content_type == JSON_PATCH else patching.merge_patch(scale, body)
    return update_scale(rest, rt, version, stored, patched, opts)


def _at(obj: Any, path: str | None) -> Any:
    if not path:
        return None
    cur = obj
    for part in path.lstrip(".").split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _set_at(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.lstrip(".").split(".")
    cur = obj
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
