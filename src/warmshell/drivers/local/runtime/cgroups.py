"""cpu, memory and process limits for local sandboxes through cgroups: what every backend offers
(`Backend`: a sandbox's `Group` made with its limits, frozen and thawed, its `Usage` read, removed,
and what a crashed gateway left swept), and the cgroup v2 backend, where the host delegates it
(the v1 one is `cgroups_v1`; `cgroupsetup` picks one).

On v2 the driver creates `<own cgroup>/warmshell/<gateway>/<instance>` per sandbox, writes
`cpu.max`, `memory.max` and `pids.max` (for the controllers delegated to it; `control_files` says
what goes where), and starts bwrap inside it (children inherit the cgroup; see `procs_file`).
`<gateway>` names the gateway's state directory: gateways on one host sweep only their own.
Hosts without a writable, delegated cgroup v2 hierarchy (cgroup v1, read-only `/sys/fs/cgroup`,
no controller delegated) get `Unavailable`, saying why. Blocking I/O on a pseudo filesystem:
callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "CONTROLLERS",
    "Backend",
    "CgroupV2",
    "Group",
    "Limits",
    "Unavailable",
    "Usage",
    "control_files",
    "cpu_quota",
    "detect",
    "kill_and_remove",
    "make_parent",
    "procs_file",
    "remove_parents",
    "sweep_children",
    "wait_for",
    "write_existing",
]

_log = logging.getLogger(__name__)
CONTROLLERS = ("cpu", "memory", "pids")
CPU_PERIOD_US = 100_000
# A removal kills what is left in the group and retries this often (a killed process leaves its
# cgroup only once it has exited: a few milliseconds), ~1 s in all; the next start's sweep
# tries again.
_REMOVE_TRIES = 100
_RETRY_SECONDS = 0.01
_FIRST_RETRY_SECONDS = 0.0005


@dataclass(frozen=True)
class Limits:
    """What to enforce; None = no limit on that resource."""

    cpu_millis: int | None = None
    memory_bytes: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Group:
    """One sandbox's cgroup: its name under the gateway's parent, and its directory in each
    hierarchy it has (one on v2; one per separately mounted controller on v1)."""

    name: str
    directories: tuple[Path, ...]
    # The file `warmshell-launch` enters the group through: on v1 `tasks` (see `entry_files`).
    entry: str = "cgroup.procs"

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """The files listing the group's processes, one per hierarchy (a process writes its pid
        to one to enter the group there)."""
        return tuple(procs_file(directory) for directory in self.directories)

    @property
    def entry_files(self) -> tuple[Path, ...]:
        """What `warmshell-launch` writes to, to enter the group in every hierarchy before it
        execs bwrap: `cgroup.procs`, or on v1 `tasks`, to which it writes 0 (the calling thread,
        the whole of the single-threaded launcher). A write of a pid takes the kernel's
        threadgroup lock for writing, which waits for an RCU grace period when no migration ran
        in the last few ms: most of a lone create's wall on a 2-core VM (Linux 6.18: a launch
        after a 1 s pause 12.1 ms p50 by pid, 3.4 through `tasks`); moving the calling thread
        alone skips that lock."""
        return tuple(directory / self.entry for directory in self.directories)


@dataclass(frozen=True)
class Usage:
    """What a sandbox has used, read from its cgroup (None: that controller is not there)."""

    cpu_seconds: float | None
    memory_bytes: int | None
    memory_peak_bytes: int | None
    processes: int | None


class Backend(Protocol):
    """The cgroups of one gateway's sandboxes (blocking methods: call through a thread)."""

    @property
    def version(self) -> str:
        """ "cgroup v2" or "cgroup v1": how the ResourceLimits condition names it."""
        ...

    @property
    def controllers(self) -> frozenset[str]:
        """Which of cpu, memory and pids it enforces (and "freezer" if it can freeze)."""
        ...

    def create(self, name: str, limits: Limits) -> Group:
        """Make the sandbox's group and write its limits (OSError, nothing left, if it cannot)."""
        ...

    def remove(self, group: Group) -> None:
        """Kill whatever still runs in the group and remove it (failures logged, never raised)."""
        ...

    def freeze(self, group: Group, *, frozen: bool) -> None:
        """Freeze (or thaw) every process of the group; returns once they are (OSError if not)."""
        ...

    def usage(self, group: Group) -> Usage:
        """cpu seconds, memory now and at its peak, and the processes of the group."""
        ...

    def sweep(self) -> list[str]:
        """Remove every group a previous run of this gateway left (killing what runs in them);
        the names removed."""
        ...

    def close(self) -> None:
        """Remove this gateway's parent, once its sandboxes' groups are gone (if it is empty)."""
        ...


def cpu_quota(cpu_millis: int) -> int:
    """The CFS quota per `CPU_PERIOD_US` for `cpu_millis` of cpu (pure): at least 1ms, as the
    kernel refuses a smaller quota."""
    return max(1000, cpu_millis * CPU_PERIOD_US // 1000)


def control_files(limits: Limits, controllers: frozenset[str]) -> dict[str, str]:
    """The control files of a sandbox's cgroup and what to write in each, for the limits set
    and the controllers this host delegates (pure)."""
    files: dict[str, str] = {}
    if limits.cpu_millis is not None and "cpu" in controllers:
        files["cpu.max"] = f"{cpu_quota(limits.cpu_millis)} {CPU_PERIOD_US}\n"
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
    """A delegated cgroup v2 directory (this gateway's parent) with some of `CONTROLLERS`
    enabled for its children; every v2 cgroup but the root can be frozen."""

    version = "cgroup v2"

    def __init__(self, base: Path, controllers: frozenset[str] = frozenset(CONTROLLERS)) -> None:
        self.base = base
        self.controllers = controllers | {"freezer"}

    def create(self, name: str, limits: Limits) -> Group:
        """Make the sandbox's cgroup and write its limits."""
        path = self.base / name
        path.mkdir(exist_ok=True)
        try:
            for file, content in control_files(limits, self.controllers).items():
                (path / file).write_text(content)
        except OSError:
            kill_and_remove([path])
            raise
        return Group(name, (path,))

    def remove(self, group: Group) -> None:
        """Kill what is left in the sandbox's cgroup and remove it; failures are logged."""
        self.freeze(group, frozen=False, wait=False)  # a frozen process cannot die
        kill_and_remove(group.directories)

    def freeze(self, group: Group, *, frozen: bool, wait: bool = True) -> None:
        """Write `cgroup.freeze`; wait until `cgroup.events` says it is (un)frozen."""
        (path,) = group.directories
        with contextlib.suppress(FileNotFoundError):
            write_existing(path / "cgroup.freeze", "1\n" if frozen else "0\n")
        if wait:
            expected = f"frozen {int(frozen)}"
            wait_for(lambda: expected in (path / "cgroup.events").read_text().splitlines(), f"{path} {expected}")

    def usage(self, group: Group) -> Usage:
        """From `cpu.stat`, `memory.current` and `memory.peak` (Linux 5.19+), `pids.current`."""
        (path,) = group.directories
        stat = dict(line.split() for line in _read(path / "cpu.stat", "").splitlines() if line.count(" ") == 1)
        cpu = int(stat["usage_usec"]) / 1e6 if "usage_usec" in stat else None
        return Usage(
            cpu_seconds=cpu,
            memory_bytes=_number(path / "memory.current"),
            memory_peak_bytes=_number(path / "memory.peak"),
            processes=_number(path / "pids.current"),
        )

    def sweep(self) -> list[str]:
        """Remove every sandbox cgroup under this gateway's parent."""
        return sweep_children([self.base], self.remove)

    def close(self) -> None:
        """Remove this gateway's parent if it is empty."""
        remove_parents([self.base])


def procs_file(path: Path) -> Path:
    """The file a process writes its pid to to enter the cgroup at `path`.

    Python cannot spawn straight into a cgroup (no CLONE_INTO_CGROUP) and moving bwrap after it
    started would race with the processes it forks; so `warmshell-launch` writes its own pid
    here before it execs bwrap (same pid): there is no such window."""
    return path / "cgroup.procs"


def kill_and_remove(directories: Iterable[Path]) -> None:
    """SIGKILL every process left in each cgroup directory and remove it (blocking; what
    cannot be removed in ~1 s is logged and left for the next start's sweep)."""
    for directory in directories:
        for _ in range(_REMOVE_TRIES):
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    _log.warning("cannot remove cgroup %s: %s", directory, exc)
                    break
            for pid in _read(procs_file(directory), "").split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(_RETRY_SECONDS)
        else:
            _log.warning("cannot remove cgroup %s: its processes would not end", directory)


def sweep_children(parents: Iterable[Path], remove: Callable[[Group], None]) -> list[str]:
    """`remove` every group found under the parents (blocking): the names removed."""
    names = sorted(
        {entry.name for parent in parents if parent.is_dir() for entry in os.scandir(parent) if entry.is_dir()}
    )
    for name in names:
        remove(Group(name, tuple(parent / name for parent in parents if (parent / name).is_dir())))
    return names


def remove_parents(parents: Iterable[Path]) -> None:
    """rmdir each gateway parent (blocking); one still holding a group is left, and said. The
    `warmshell` directory above goes too once no gateway has a parent in it, so that the cgroup
    the gateway was started in (a service's, a session's) can be removed after it."""
    for parent in parents:
        try:
            parent.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log.warning("cannot remove this gateway's cgroup %s: %s", parent, exc)
            continue
        with contextlib.suppress(OSError):  # another gateway's parent is there: it stays
            parent.parent.rmdir()


def make_parent(parent: Path) -> None:
    """mkdir a gateway parent and the `warmshell` directory above it (blocking), again if
    another gateway's `remove_parents` took that directory away in between."""
    for _ in range(3):
        with contextlib.suppress(FileNotFoundError):
            parent.mkdir(parents=True, exist_ok=True)
            return
    parent.mkdir(parents=True, exist_ok=True)


def wait_for(done: Callable[[], bool], what: str, *, seconds: float = 2.0) -> None:
    """Poll `done` until it holds (`seconds` at most, blocking); OSError naming `what` if it never
    does. The first polls come fast: a freeze is usually done within a millisecond, and a fork or
    pause waits for it with its sandbox stopped, so a first sleep of 10 ms was most of the time
    an idle sandbox's fork kept it frozen."""
    deadline = time.monotonic() + seconds
    delay = _FIRST_RETRY_SECONDS
    while not done():
        if time.monotonic() >= deadline:
            raise OSError(errno.ETIMEDOUT, f"{what}: not reached")
        time.sleep(delay)
        delay = min(delay * 2, _RETRY_SECONDS)


def write_existing(path: Path, text: str) -> None:
    """Write a control file, never creating it (FileNotFoundError when there is none)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: Path, missing: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return missing


def _number(path: Path) -> int | None:
    text = _read(path, "").strip()
    return int(text) if text.isdigit() else None


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
    root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup"), *, gateway: str
) -> CgroupV2 | Unavailable:
    """A usable cgroup v2 parent for the sandboxes of the gateway named `gateway`, or why there
    is none."""
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
        make_parent(base / gateway)
        for directory in (base, base / gateway):
            _enable(directory, controllers)
    except OSError as exc:
        return Unavailable(f"cannot set up a delegated cgroup under {root}: {exc}")
    return CgroupV2(base / gateway, controllers)
