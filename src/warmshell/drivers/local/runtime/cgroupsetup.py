"""Which cgroups a gateway's sandboxes get: v2 where the host delegates it, else v1 where its
controllers are mounted and writable (as root), else none, with both reasons."""

from __future__ import annotations

from warmshell.drivers.local.runtime import cgroups, cgroups_v1

__all__ = ["choose"]


def choose(*, gateway: str) -> cgroups.Backend | cgroups.Unavailable:
    """The backend for the gateway named `gateway` (its sandboxes' parent cgroup), or why none."""
    v2 = cgroups.detect(gateway=gateway)
    if not isinstance(v2, cgroups.Unavailable):
        return v2
    v1 = cgroups_v1.detect(gateway=gateway)
    if not isinstance(v1, cgroups.Unavailable):
        return v1
    return cgroups.Unavailable(f"{v2.message}; {v1.message}")
