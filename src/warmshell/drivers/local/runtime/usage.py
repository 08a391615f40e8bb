"""What a local sandbox uses, read when asked: cpu, memory and processes from its cgroup, and the
bytes in its /workspace from the tmpfs's own counters (one `fstatvfs`).

A handful of small reads, so `sandbox get` stays cheap: never a walk of the sandbox's files (a
/workspace of 100,000 small files takes the best part of a second of the host's cpu to walk, and
the workload decides how many there are). A /workspace bound from a host directory shares that
directory's filesystem, whose counters say nothing about this sandbox: it is reported unknown.
Blocking (pseudo-filesystem reads): callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

from warmshell.drivers.base import SandboxUsage
from warmshell.drivers.local.runtime import cgroups
from warmshell.drivers.local.runtime.sandboxing import WORKSPACE

__all__ = ["Sources", "read", "workspace_bytes"]


@dataclass(frozen=True)
class Sources:
    """Where one sandbox's figures come from; a source that is None is missing, and `missing`
    says why, in words (shown to the caller as the usage's `unknown`)."""

    cgroup: tuple[cgroups.Backend, cgroups.Group] | None
    # Opens an O_PATH fd on the sandbox's root (which `read` closes), when its /workspace is a
    # tmpfs of its own.
    open_root: Callable[[], int] | None
    missing: tuple[str, ...] = ()


def read(sources: Sources) -> SandboxUsage:
    """The sandbox's usage now, from what `sources` has."""
    unknown = list(sources.missing)
    figures = cgroups.Usage(None, None, None, None)
    if sources.cgroup is not None:
        backend, group = sources.cgroup
        figures = backend.usage(group)
        # A controller the host does not mount (or a file its kernel predates, `memory.peak`).
        absent = [name for name, value in dataclasses.asdict(figures).items() if value is None]
        if absent:
            unknown.append(f"{', '.join(absent)}: not kept by this host's {backend.version}")
    workspace = None
    if sources.open_root is not None:
        try:
            root = sources.open_root()
            try:
                workspace = workspace_bytes(root)
            finally:
                os.close(root)
        except OSError as exc:
            unknown.append(f"{WORKSPACE}: {exc.strerror or exc}")
    return SandboxUsage(
        cpu_seconds=figures.cpu_seconds,
        memory_bytes=figures.memory_bytes,
        memory_peak_bytes=figures.memory_peak_bytes,
        processes=figures.processes,
        workspace_bytes=workspace,
        unknown="; ".join(unknown),
    )


def workspace_bytes(root: int) -> int:
    """Bytes in use on the filesystem mounted at /workspace under the directory fd `root`.

    Opened without following a link: `root` is the sandbox's root as the host sees it, where an
    absolute link the workload made would resolve against the host's own root."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(WORKSPACE.lstrip("/"), flags, dir_fd=root)
    try:
        stats = os.fstatvfs(fd)
    finally:
        os.close(fd)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize
