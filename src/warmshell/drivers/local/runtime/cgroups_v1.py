"""The cgroup v1 backend: each controller its own hierarchy (or a few mounted together, as
systemd's `cpu,cpuacct`), writable by root.

Per sandbox, `<own cgroup>/warmshell/<gateway>/<instance>` in the `cpu` (CFS quota and period),
`memory` (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` with the same figure where
the host accounts swap: swap counts too), `pids` (`pids.max`), `freezer` and `cpuacct` (usage)
hierarchies. Kernel memory needs no file of its own: since Linux 5.x v1 charges it (tmpfs inodes,
dentries, page tables) to the memory cgroup by default, and `memory.kmem.limit_in_bytes` is
deprecated (writes are accepted and ignored on 6.x). Measured on this project's hosts (6.18, v1):
300,000 empty files on a tmpfs in a 64 MiB group pinned ~60 MB of kernel memory and the writer
was OOM-killed inside its group. Blocking I/O: callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from warmshell.drivers.local.runtime import cgroups
from warmshell.drivers.local.runtime.cgroups import Group, Limits, Unavailable, Usage

__all__ = ["CONTROLLERS", "CgroupV1", "control_files", "detect", "hierarchies"]

# What a sandbox is placed in: the three that bound it, the freezer (pause, snapshot), and
# cpuacct (its cpu seconds; a hierarchy of its own on some hosts, with cpu on others).
CONTROLLERS = ("cpu", "memory", "pids", "freezer", "cpuacct")
_BOUNDING = ("cpu", "memory", "pids")


def control_files(limits: Limits, controllers: frozenset[str], *, swap_accounted: bool) -> dict[str, dict[str, str]]:
    """For each controller, its control files and what to write in each, in the order to write
    them (pure): the memory limit before the memory+swap one, which may never be below it."""
    files: dict[str, dict[str, str]] = {}
    if limits.cpu_millis is not None and "cpu" in controllers:
        # The quota alone: a new v1 group's period is the kernel's default, `CPU_PERIOD_US`
        # (100 ms, set by `init_cfs_bandwidth`), and each write of a CFS file takes the kernel's
        # bandwidth locks: half a millisecond of a start's wall time on a loaded 2-core host.
        files["cpu"] = {"cpu.cfs_quota_us": f"{cgroups.cpu_quota(limits.cpu_millis)}\n"}
    if limits.memory_bytes is not None and "memory" in controllers:
        files["memory"] = {"memory.limit_in_bytes": f"{limits.memory_bytes}\n"}
        if swap_accounted:
            files["memory"]["memory.memsw.limit_in_bytes"] = f"{limits.memory_bytes}\n"
    if limits.pids is not None and "pids" in controllers:
        files["pids"] = {"pids.max": f"{limits.pids}\n"}
    return files


def hierarchies(mountinfo: str, self_cgroup: str) -> dict[str, Path]:
    """Where this process's own cgroup is in each mounted v1 hierarchy of `CONTROLLERS` (pure;
    `mountinfo` and `self_cgroup` are /proc/self/mountinfo and /proc/self/cgroup). A mount of a
    subtree (a container's) is followed: its root is taken off the process's path."""
    own: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                own[controller] = parts[2]
    found: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        described, left = tail.split(), fields.split()
        if len(described) < 3 or described[0] != "cgroup" or len(left) < 5:
            continue
        root, mountpoint = _unescape(left[3]), Path(_unescape(left[4]))
        for controller in set(described[2].split(",")) & set(CONTROLLERS):
            path = own.get(controller)
            if controller in found or path is None or os.path.commonpath([root, path]) != root:
                continue
            found[controller] = mountpoint / os.path.relpath(path, root)
    return found


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _write(path: str, text: str) -> None:
    """A control file's content in one write (as `Path.write_text`, without its text layer)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _removed_if_empty(directories: tuple[Path, ...]) -> bool:
    """rmdir each directory; False at the first that is still in use (or cannot go), leaving it
    and those after it for the full removal."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


@dataclass
class CgroupV1:
    """This gateway's parent directory in each v1 hierarchy it may write."""

    parents: dict[str, Path]  # controller -> <own cgroup>/warmshell/<gateway> in its hierarchy
    swap_accounted: bool = False
    version = "cgroup v1"

    @property
    def controllers(self) -> frozenset[str]:
        """The bounding controllers it has, and the freezer."""
        return frozenset(c for c in (*_BOUNDING, "freezer") if c in self.parents)

    def _directories(self, name: str) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(parent / name for parent in self.parents.values()))

    def create(self, name: str, limits: Limits) -> Group:
        """Make the sandbox's group in every hierarchy and write its limits (plain `os` calls on
        strings: a pool fill makes a hundred groups a second, and pathlib's joins and text files
        were a third of the CPU each one cost)."""
        group = Group(name, self._directories(name), entry="tasks")
        try:
            for directory in group.directories:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory)
            for controller, files in control_files(
                limits, self.controllers, swap_accounted=self.swap_accounted
            ).items():
                base = f"{self.parents[controller]}/{name}/"
                for file, content in files.items():
                    _write(base + file, content)
        except OSError:
            cgroups.kill_and_remove(group.directories)
            raise
        return group

    def remove(self, group: Group) -> None:
        """Remove the group; when something still runs in it, thaw it (a frozen process cannot
        die), kill what is left and remove it then. The sandbox has nearly always ended by now:
        its empty directories go first, without the freezer write each stop paid for."""
        if _removed_if_empty(group.directories):
            return
        with contextlib.suppress(OSError):
            self.freeze(group, frozen=False, wait=False)
        cgroups.kill_and_remove(group.directories)

    def freeze(self, group: Group, *, frozen: bool, wait: bool = True) -> None:
        """Write `freezer.state`; wait until the kernel says it is FROZEN (or THAWED)."""
        parent = self.parents.get("freezer")
        if parent is None:
            raise OSError(errno.ENOTSUP, "no writable cgroup v1 freezer hierarchy on this host")
        state = parent / group.name / "freezer.state"
        target = "FROZEN" if frozen else "THAWED"
        cgroups.write_existing(state, f"{target}\n")
        if wait:
            cgroups.wait_for(lambda: state.read_text().strip() == target, f"{state} {target}")

    def usage(self, group: Group) -> Usage:
        """From `cpuacct.usage` (ns), `memory.usage_in_bytes`, `memory.max_usage_in_bytes` and
        `pids.current`."""

        def number(controller: str, file: str) -> int | None:
            parent = self.parents.get(controller)
            if parent is None:
                return None
            with contextlib.suppress(FileNotFoundError, ValueError):
                return int((parent / group.name / file).read_text())
            return None

        nanoseconds = number("cpuacct", "cpuacct.usage")
        return Usage(
            cpu_seconds=None if nanoseconds is None else nanoseconds / 1e9,
            memory_bytes=number("memory", "memory.usage_in_bytes"),
            memory_peak_bytes=number("memory", "memory.max_usage_in_bytes"),
            processes=number("pids", "pids.current"),
        )

    def sweep(self) -> list[str]:
        """Remove every sandbox group under this gateway's parents."""
        return cgroups.sweep_children(list(dict.fromkeys(self.parents.values())), self.remove)

    def close(self) -> None:
        """Remove this gateway's parents if they are empty."""
        cgroups.remove_parents(dict.fromkeys(self.parents.values()))


def detect(
    mountinfo: Path = Path("/proc/self/mountinfo"), self_cgroup: Path = Path("/proc/self/cgroup"), *, gateway: str
) -> CgroupV1 | Unavailable:
    """This gateway's parents in the v1 hierarchies it can write, or why there are none."""
    try:
        own = hierarchies(mountinfo.read_text(), self_cgroup.read_text())
    except OSError as exc:
        return Unavailable(f"cannot read the cgroup v1 mounts: {exc}")
    parents: dict[str, Path] = {}
    refused: list[str] = []
    for controller, directory in own.items():
        parent = directory / "warmshell" / gateway
        try:
            cgroups.make_parent(parent)
        except OSError as exc:
            refused.append(f"{controller}: {exc.strerror}")
            continue
        parents[controller] = parent
    if not any(c in parents for c in _BOUNDING):
        why = f" ({', '.join(refused)})" if refused else ""
        return Unavailable(f"no writable cgroup v1 cpu, memory or pids hierarchy is mounted{why}")
    swap = "memory" in parents and (parents["memory"] / "memory.memsw.limit_in_bytes").exists()
    return CgroupV1(parents, swap_accounted=swap)
