"""Discovery documents: aggregated (apidiscovery.k8s.io/v2) and legacy, chosen by Accept header.

kubectl 1.37 asks ``/api`` and ``/apis`` for the aggregated form first; if it gets it, it fetches
nothing else. Older clients and kubernetes_asyncio read the legacy ``APIResourceList``s.
"""

from __future__ import annotations

import re
from typing import Any

from kubesim.apiserver.resources import Registry, ResourceType

AGGREGATED_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
VERSION = {
    "major": "1",
    "minor": "37",
    "emulationMajor": "1",
    "emulationMinor": "37",
    "gitVersion": "v1.37.1-kubesim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-11-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_SUB_KINDS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "scale": ("autoscaling", "v1", "Scale", ("get", "patch", "update")),
    "token": ("authentication.k8s.io", "v1", "TokenRequest", ("create",)),
    "binding": ("", "v1", "Binding", ("create",)),
    "finalize": ("", "v1", "Namespace", ("update",)),
}
_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int]:
    """Sort key implementing Kubernetes version priority (v2 > v1 > v1beta2 > v1alpha1 > other)."""
    m = _VERSION_RE.match(version)
    if not m:
        return (0, 0, 0)
    major, stage, minor = m.groups()
    rank = {None: 3, "beta": 2, "alpha": 1}[stage]
    return (rank, int(major), int(minor or 0))


def wants_aggregated(accept: str) -> bool:
    """Whether the client accepts the aggregated v2 discovery format (it always prefers it)."""
    for media in accept.split(","):
        params = {p.strip() for p in media.split(";")[1:]}
        if {"g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"} <= params:
            return True
    return False


def _sub_info(rt: ResourceType, sub: str, version: str) -> tuple[str, str, str, tuple[str, ...]]:
    if sub in _SUB_KINDS:
        return _SUB_KINDS[sub]
    return (rt.group, version, rt.kind, ("get", "patch", "update"))


def _ordered(versions: list[str]) -> list[str]:
    return sorted(versions, key=version_priority, reverse=True)


def _groups(registry: Registry) -> dict[str, dict[str, list[ResourceType]]]:
    out: dict[str, dict[str, list[ResourceType]]] = {}
    for rt in registry.all():
        for v in rt.versions:
            out.setdefault(rt.group, {}).setdefault(v, []).append(rt)
    return out


def aggregated(registry: Registry, *, core: bool) -> dict[str, Any]:
    """The APIGroupDiscoveryList for ``/api`` (core) or ``/apis`` (everything else)."""
    items = []
    for group, versions in _groups(registry).items():
        if (group == "") != core:
            continue
        vs = []
        for v in _ordered(list(versions)):
            resources = []
            for rt in versions[v]:
                entry: dict[str, Any] = {
                    "resource": rt.plural,
                    "responseKind": {"group": rt.group, "version": v, "kind": rt.kind},
                    "scope": "Namespaced" if rt.namespaced else "Cluster",
                    "singularResource": rt.singular,
                    "verbs": sorted(rt.verbs),
                }
                if rt.short_names:
                    entry["shortNames"] = rt.short_names
                if rt.categories:
                    entry["categories"] = rt.categories
                subs = []
                for sub in rt.subresources:
                    g, sv, kind, verbs = _sub_info(rt, sub, v)
                    subs.append(
                        {
                            "subresource": sub,
                            "responseKind": {"group": g, "version": sv, "kind": kind},
                            "verbs": list(verbs),
                        }
                    )
                if subs:
                    entry["subresources"] = subs
                resources.append(entry)
            vs.append({"version": v, "resources": resources, "freshness": "Current"})
        metadata: dict[str, Any] = {"creationTimestamp": None}
        if group:
            metadata["name"] = group
        items.append({"metadata": metadata, "versions": vs})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


def api_versions(server_address: str) -> dict[str, Any]:
    """Legacy ``/api``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in _ordered(versions)]
    return {"name": group, "versions": vs, "preferredVersion": vs[0]}


def api_groups(registry: Registry) -> dict[str, Any]:
    """Legacy ``/apis``."""
    groups = [_group_entry(g, list(vs)) for g, vs in _groups(registry).items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    """Legacy ``/apis/<group>``."""
    versions = _groups(registry).get(group)
    if not versions or not group:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, list(versions))}


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    """Legacy ``/api/v1`` or ``/apis/<group>/<version>``."""
    rts = _groups(registry).get(group, {}).get(version)
    if rts is None:
        return None
    resources: list[dict[str, Any]] = []
    for rt in rts:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": sorted(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = rt.short_names
        if rt.categories:
            entry["categories"] = rt.categories
        resources.append(entry)
        for sub in rt.subresources:
            g, sv, kind, verbs = _sub_info(rt, sub, version)
            sub_entry: dict[str, Any] = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": kind,
                "verbs": list(verbs),
            }
            if g != rt.group:
                sub_entry["group"] = g
                sub_entry["version"] = sv
            resources.append(sub_entry)
    gv = f"{group}/{version}" if group else version
    body: dict[str, Any] = {"kind": "APIResourceList", "groupVersion": gv, "resources": resources}
    if group:
        body["apiVersion"] = "v1"
    return body
