"""What a local sandbox's usage is read from: /workspace's filesystem counters (never followed
through a link), the cgroup's figures, and what is missing said in words."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from warmshell.drivers.local.runtime import cgroups, usage


def _opener(root: Path) -> Callable[[], int]:
    return lambda: os.open(root, os.O_PATH | os.O_DIRECTORY)


def test_workspace_bytes_are_its_filesystems_counters(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        found = usage.workspace_bytes(fd)
    finally:
        os.close(fd)
    stats = os.statvfs(tmp_path)
    # The same filesystem as tmp_path; others write to it meanwhile, so a close match, not equality.
    assert abs(found - (stats.f_blocks - stats.f_bfree) * stats.f_frsize) < 64 * 2**20


def test_a_workspace_link_is_not_followed(tmp_path: Path) -> None:
    # The root is the sandbox's, seen from the host: an absolute link made inside would resolve
    # against the host's root.
    (tmp_path / "workspace").symlink_to("/")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(NotADirectoryError):
            usage.workspace_bytes(fd)
    finally:
        os.close(fd)


class _Backend:
    """A cgroup backend that reads fixed figures (the real ones are tested on this host)."""

    version = "cgroup test"
    controllers = frozenset({"cpu", "memory", "pids"})

    def usage(self, group: cgroups.Group) -> cgroups.Usage:
        return cgroups.Usage(cpu_seconds=1.5, memory_bytes=10, memory_peak_bytes=20, processes=3)


def test_read_combines_the_cgroup_and_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    group = cgroups.Group("g", ())
    found = usage.read(usage.Sources((_Backend(), group), _opener(tmp_path)))  # type: ignore[arg-type]
    assert (found.cpu_seconds, found.memory_bytes, found.memory_peak_bytes, found.processes) == (1.5, 10, 20, 3)
    assert found.workspace_bytes is not None
    assert found.unknown == ""


class _PartialBackend(_Backend):
    """A host whose kernel keeps no memory peak and mounts no pids controller."""

    def usage(self, group: cgroups.Group) -> cgroups.Usage:
        return cgroups.Usage(cpu_seconds=1.5, memory_bytes=10, memory_peak_bytes=None, processes=None)


def test_read_names_the_figures_the_hosts_cgroup_does_not_keep(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    sources = usage.Sources((_PartialBackend(), cgroups.Group("g", ())), _opener(tmp_path))  # type: ignore[arg-type]
    found = usage.read(sources)
    assert (found.cpu_seconds, found.memory_peak_bytes, found.processes) == (1.5, None, None)
    assert found.unknown == "memory_peak_bytes, processes: not kept by this host's cgroup test"


def test_read_says_what_is_missing_and_why(tmp_path: Path) -> None:
    found = usage.read(usage.Sources(None, _opener(tmp_path), ("cpu, memory and processes: no cgroup",)))
    assert found.figures() == dict.fromkeys(found.figures())  # every figure unknown
    assert found.unknown.startswith("cpu, memory and processes: no cgroup; /workspace: ")
