"""cpu and memory limits for local sandboxes through cgroup v2, where the host delegates it.

The driver creates `<own cgroup>/warmshell/<instance>` per sandbox, writes `cpu.max` and
`memory.max`, and starts bwrap inside it (children inherit the
cgroup; see `enter_argv`).
Hosts without a writable, delegated cgroup v2 hierarchy (cgroup v1, read-only `/sys/fs/cgroup`,
controllers not delegated) get no limits, and `detect` says why so the driver can put that on
each sandbox as a condition. Blocking I/O on a pseudo filesystem: callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.models import SandboxSpec
from warmshell.core.quantities import cpu_millis, memory_bytes

__all__ = ["CgroupV2", "Limits", "Unavailable", "detect", "enter_argv"]

_log = logging.getLogger(__name__)
_CONTROLLERS = ("cpu", "memory")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """What to enforce; None = no limit on that resource."""

    cpu_millis: int | None = None
    memory_bytes: int | None = None

    def __bool__(self) -> bool:
        return self.cpu_millis is not None or self.memory_bytes is not None

    @classmethod
    def of(cls, spec: SandboxSpec) -> Limits:
        """The limits a spec asks for."""
        cpu, memory = spec.resources.cpu, spec.resources.memory
        return cls(
            cpu_millis=cpu_millis(cpu, field="spec.resources.cpu") if cpu else None,
            memory_bytes=memory_bytes(memory, field="spec.resources.memory") if memory else None,
        )


@dataclass(frozen=True)
class Unavailable:
    """Why limits cannot be applied on this host."""

    message: str


class CgroupV2:
    """A delegated cgroup v2 directory with cpu and memory enabled for its children."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def create(self, name: str, limits: Limits) -> Path:
        """Make the sandbox's cgroup and write its limits."""
        path = self.base / name
        path.mkdir(exist_ok=True)
        if limits.cpu_millis is not None:
            quota = limits.cpu_millis * _CPU_PERIOD_US // 1000
            (path / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}\n")
        if limits.memory_bytes is not None:
            (path / "memory.max").write_text(f"{limits.memory_bytes}\n")
        return path

    def remove(self, path: Path) -> None:
        """Remove an emptied sandbox cgroup; failures are logged, never raised."""
        try:
            path.rmdir()
        except OSError as exc:
            _log.debug("cannot remove cgroup %s: %s", path, exc)


def enter_argv(path: Path) -> list[str]:
    """A prefix that moves the process into the cgroup, then execs the rest of the argv.

    Python cannot spawn straight into a cgroup (no CLONE_INTO_CGROUP) and moving bwrap after it
    started would race with the processes it forks; a shell that moves itself and then execs
    bwrap (same pid) has no such window."""
    script = 'echo $$ > "$1" && shift && exec "$@"'
    return ["/bin/sh", "-c", script, "warmshell-cgroup", str(path / "cgroup.procs")]


def _own_cgroup(self_cgroup: Path) -> str | None:
    for line in self_cgroup.read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _enable(directory: Path) -> None:
    control = directory / "cgroup.subtree_control"
    enabled = control.read_text().split() if control.exists() else []
    missing = [c for c in _CONTROLLERS if c not in enabled]
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
        available = (own / "cgroup.controllers").read_text().split()
        if any(c not in available for c in _CONTROLLERS):
            return Unavailable(f"cpu and memory controllers are not delegated to {own}")
        # Fails with EBUSY when the gateway's own cgroup holds processes and is not the root
        # ("no internal processes"): run the gateway in a delegated scope to get limits.
        _enable(own)
        base = own / "warmshell"
        base.mkdir(exist_ok=True)
        _enable(base)
    except OSError as exc:
        return Unavailable(f"cannot set up a delegated cgroup under {root}: {exc}")
    return CgroupV2(base)
