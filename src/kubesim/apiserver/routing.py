"""Turn a request path into a ``RequestInfo`` (group, version, namespace, resource, name, subresource).

Mirrors k8s.io/apiserver's RequestInfoFactory, including the deprecated ``/watch/`` prefix and the
``namespaces/<ns>/status`` ambiguity; trailing slashes are tolerated (kr8s sends them).
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE_SUBRESOURCES = {"status", "finalize"}


@dataclass
class RequestInfo:
    """What a resource request addresses."""

    group: str
    version: str
    resource: str
    namespace: str | None = None
    name: str = ""
    subresource: str = ""
    watch_prefix: bool = False


def parse(path: str) -> RequestInfo | None:
    """Parse ``/api/v1/...`` or ``/apis/<g>/<v>/...``; ``None`` for discovery and other paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    watch_prefix = False
    if rest and rest[0] == "watch":
        watch_prefix = True
        rest = rest[1:]
    if not rest:
        return None
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 2:
        if len(rest) == 2 or (len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES):
            # The namespace object itself (and its status/finalize subresources).
            return RequestInfo(
                group, version, "namespaces", None, rest[1], rest[2] if len(rest) == 3 else "", watch_prefix
            )
        namespace, rest = rest[1], rest[2:]
    info = RequestInfo(group, version, rest[0], namespace, watch_prefix=watch_prefix)
    if len(rest) >= 2:
        info.name = rest[1]
    if len(rest) >= 3:
        info.subresource = rest[2]
    if len(rest) > 3:
        return None
    return info
