"""cpu, memory and process limits for local sandboxes through cgroup v2, where the host delegates it.

The driver creates `<own cgroup>/warmshell/<instance>` per sandbox, writes `cpu.max`,
`memory.max` and `pids.max` (for the controllers delegated to it; `control_files` says what goes
where), and starts bwrap inside it (children inherit the cgroup; see `procs_file`).
Hosts without a writable, delegated cgroup v2 hierarchy (cgroup v1, read-only `/sys/fs/cgroup`,
no controller delegated) get no cgroup limits, and `detect` says why so the driver can say it
once at start and on each sandbox as a condition. Blocking I/O on a pseudo filesystem: callers
use `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONTROLLERS", "CgroupV2", "Limits", "Unavailable", "control_files", "detect", "procs_file"]

_log = logging.getLogger(__name__)
CONTROLLERS = ("cpu", "memory", "pids")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """What to enforce; None = no limit on that resource."""

    cpu_millis: int | None = None
    memory_bytes: int | None = None
    pids: int | None = None


def control_files(limits: Limits, controllers: frozenset[str]) -> dict[str, str]:
    """The control files of a sandbox's cgroup and what to write in each, for the limits set
    and the controllers this host delegates (pure)."""
    files: dict[str, str] = {}
    if limits.cpu_millis is not None and "cpu" in controllers:
        # At least 1ms of every 100ms period: the kernel refuses a smaller quota.
        quota = max(1000, limits.cpu_millis * _CPU_PERIOD_US // 1000)
        files["cpu.max"] = f"{quota} {_CPU_PERIOD_US}\n"
    if limits.memory_bytes is not None and "memory" in controllers:
        files["memory.max"] = f"{limits.memory_bytes}\n"
    if limits.pids is not None and "pids" in controllers:
        files["pids.max"] = f"{limits.pids}\n"
    return files


@dataclass(frozen=True)
class Unavailable:
    """Why limits cannot be applied on this host."""

    message: str


class CgroupV2:
    """A delegated cgroup v2 directory with some of `CONTROLLERS` enabled for its children."""

    def __init__(self, base: Path, controllers: frozenset[str] = frozenset(CONTROLLERS)) -> None:
        self.base = base
        self.controllers = controllers

    def create(self, name: str, limits: Limits) -> Path:
        """Make the sandbox's cgroup and write its limits."""
        path = self.base / name
        path.mkdir(exist_ok=True)
        for file, content in control_files(limits, self.controllers).items():
            (path / file).write_text(content)
        return path

    def remove(self, path: Path) -> None:
        """Remove an emptied sandbox cgroup; failures are logged, never raised."""
        try:
            path.rmdir()
        except OSError as exc:
            _log.debug("cannot remove cgroup %s: %s", path, exc)


def procs_file(path: Path) -> Path:
    """The file a process writes its pid to to enter the cgroup at `path`.

    Python cannot spawn straight into a cgroup (no CLONE_INTO_CGROUP) and moving bwrap after it
    started would race with the processes it forks; so `warmshell-launch` writes its own pid
    here before it execs bwrap (same pid): there is no such window."""
    return path / "cgroup.procs"


def _own_cgroup(self_cgroup: Path) -> str | None:
    for line in self_cgroup.read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _enable(directory: Path, controllers: frozenset[str]) -> None:
    control = directory / "cgroup.subtree_control"
    enabled = control.read_text().split() if control.exists() else []
    missing = [c for c in CONTROLLERS if c in controllers and c not in enabled]
    if missing:
        control.write_text(" ".join(f"+{c}" for c in missing) + "\n")


def detect(
    root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> CgroupV2 | Unavailable:
    """A usable cgroup v2 parent for sandboxes, or why there is none."""
    if not (root / "cgroup.controllers").is_file():
        return Unavailable(f"cgroup v2 is not mounted at {root} (cgroup v1 or hybrid host)")
    try:
        relative = _own_cgroup(self_cgroup)
        if relative is None:
            return Unavailable(f"{self_cgroup} has no cgroup v2 entry")
        own = root / relative.lstrip("/")
        controllers = frozenset(c for c in (own / "cgroup.controllers").read_text().split() if c in CONTROLLERS)
        if not controllers:
            return Unavailable(f"none of the cpu, memory and pids controllers is delegated to {own}")
        # Fails with EBUSY when the gateway's own cgroup holds processes and is not the root
        # ("no internal processes"): run the gateway in a delegated scope to get limits.
        _enable(own, controllers)
        base = own / "warmshell"
        base.mkdir(exist_ok=True)
        _enable(base, controllers)
    except OSError as exc:
        return Unavailable(f"cannot set up a delegated cgroup under {root}: {exc}")
    return CgroupV2(base, controllers)
