"""The bounds of every local sandbox (gateway defaults, a profile's or a request's overrides, the
configured maximums) and the `ResourceLimits` condition that says exactly which are enforced (pure).

Always, under bubblewrap: sized tmpfs for `/workspace`, `/tmp`, `/run` and `/dev/shm` (and `/dev`
itself is remounted read-only), a file-size rlimit on every process; with a uid per sandbox (a
gateway run as root) a process-count rlimit, which counts that uid's processes, i.e. that
sandbox's alone. cpu and memory (and the process count without a uid per sandbox) need a
cgroup: a delegated v2 one (`cgroups`) or v1 controllers writable by the gateway (`cgroups_v1`);
a request that asks for one the host cannot enforce is refused (`unenforced_field`), unless
`local.allow_unenforced_limits`. Open files: a descriptor rlimit per process, lowered so that the
sandbox's processes together cannot hold more than a share of the host's file table
(fs.file-max, which every process on the host shares: once full, every open gets ENFILE). A
sandbox that hits a bound gets ENOSPC, EFBIG, EAGAIN, EMFILE or the OOM killer inside; nothing
outside it is affected.

`/workspace` is a tmpfs, mounted by bwrap in the sandbox's own mount namespace: nearly free to
set up (bench/investigations/workspace-bound/ measured it against a loop-mounted image), gone with the
sandbox, and charged to its memory cgroup where there is one. `local.workspace_size = ""` keeps
it a directory on the host's disk instead, without a bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from warmshell.core.config import LocalDriverConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import SandboxSpec
from warmshell.core.quantities import cpu_millis, memory_bytes, render_cpu, render_memory
from warmshell.drivers.base import DriverCondition
from warmshell.drivers.local.runtime import cgroups

__all__ = [
    "DEFAULT_ROOT_BYTES",
    "PRLIMIT",
    "Bounds",
    "Maximums",
    "check_maximum",
    "condition",
    "enforceable",
    "prlimit_argv",
    "rlimit_options",
    "unenforced_field",
]

PRLIMIT = "/usr/bin/prlimit"  # util-linux, on every Debian
# One sandbox's processes may hold at most this fraction of the host's file table between them.
FILE_TABLE_SHARE = 4
# ...but each process keeps at least this many descriptors (a pids request so large that this
# floor passes the share is bounded by its process count alone; the condition says so).
MIN_OPEN_FILES = 64
DEFAULT_ROOT_BYTES = 1 << 30


@dataclass(frozen=True)
class Bounds:
    """What bounds one sandbox: bytes, millicores, processes (None = no bound)."""

    workspace_bytes: int | None  # None: a host directory
    tmp_bytes: int
    run_bytes: int
    shm_bytes: int
    file_bytes: int
    processes: int
    cpu_millis: int | None = None
    memory_bytes: int | None = None
    max_open_files: int = 1024  # descriptors per process, at most (`local.max_open_files`)
    file_budget: int | None = None  # open files of all its processes together (None: no budget)
    root_bytes: int = DEFAULT_ROOT_BYTES  # the upper layer over an image's layers (`local.root_size`)

    @classmethod
    def of(cls, config: LocalDriverConfig, *, host_file_max: int | None = None) -> Bounds:
        """The gateway's defaults (`[local]`); `host_file_max` (fs.file-max) sets the open-file
        budget to a `FILE_TABLE_SHARE` of it."""
        return cls(
            workspace_bytes=_size(config.workspace_size, "local.workspace_size"),
            tmp_bytes=memory_bytes(config.tmp_size, field="local.tmp_size"),
            run_bytes=memory_bytes(config.run_size, field="local.run_size"),
            shm_bytes=memory_bytes(config.shm_size, field="local.shm_size"),
            file_bytes=memory_bytes(config.max_file_size, field="local.max_file_size"),
            processes=config.max_processes,
            cpu_millis=cpu_millis(config.default_cpu, field="local.default_cpu") if config.default_cpu else None,
            memory_bytes=_size(config.default_memory, "local.default_memory"),
            max_open_files=config.max_open_files,
            file_budget=host_file_max // FILE_TABLE_SHARE if host_file_max else None,
            root_bytes=memory_bytes(config.root_size, field="local.root_size"),
        )

    @property
    def open_files(self) -> int:
        """RLIMIT_NOFILE of each process: `max_open_files`, or less where the process count
        times that would pass the budget (never under `MIN_OPEN_FILES`)."""
        if self.file_budget is None:
            return self.max_open_files
        return max(MIN_OPEN_FILES, min(self.max_open_files, self.file_budget // self.processes))

    def for_spec(self, spec: SandboxSpec) -> Bounds:
        """These defaults with what the spec asks for (its resources, its profile's storage)."""
        resources, storage = spec.resources, spec.storage
        changes: dict[str, int] = {}
        if resources.cpu_millis:
            changes["cpu_millis"] = resources.cpu_millis
        if resources.memory_bytes:
            changes["memory_bytes"] = resources.memory_bytes
        if resources.pids:
            changes["processes"] = resources.pids
        if storage.workspace_bytes:
            changes["workspace_bytes"] = storage.workspace_bytes
        if storage.tmp_bytes:
            changes["tmp_bytes"] = storage.tmp_bytes
        if storage.root_bytes:
            changes["root_bytes"] = storage.root_bytes
        return dataclasses.replace(self, **changes) if changes else self

    def cgroup_limits(self) -> cgroups.Limits:
        """What a cgroup would enforce of these."""
        return cgroups.Limits(cpu_millis=self.cpu_millis, memory_bytes=self.memory_bytes, pids=self.processes)


def _size(text: str, field: str) -> int | None:
    return memory_bytes(text, field=field) if text else None


def rlimit_options(bounds: Bounds, *, uid_per_sandbox: bool) -> list[str]:
    """The sandbox's rlimits as prlimit-style options (`--fsize=N`, `--nofile=N`, `--nproc=N`),
    what `warmshell-launch` takes: set before bwrap execs, inherited by all it starts, and not
    raised again without CAP_SYS_RESOURCE. The process count only with a uid per sandbox:
    RLIMIT_NPROC counts every process of the uid."""
    options = [f"--fsize={bounds.file_bytes}", f"--nofile={bounds.open_files}"]
    if uid_per_sandbox:
        options.append(f"--nproc={bounds.processes}")
    return options


def prlimit_argv(bounds: Bounds, *, uid_per_sandbox: bool) -> list[str]:
    """The same rlimits as a `prlimit` prefix that execs the rest (how sandboxes were started
    before `warmshell-launch`; the benchmark still times it)."""
    return [PRLIMIT, *rlimit_options(bounds, uid_per_sandbox=uid_per_sandbox), "--"]


def condition(
    bounds: Bounds, cgroup: cgroups.Backend | cgroups.Unavailable, *, uid_per_sandbox: bool
) -> DriverCondition:
    """`ResourceLimits`: True when every bound is enforced, else False; the message lists
    what is enforced and what is not, and why not."""
    controllers = _controllers(cgroup)
    by = "" if isinstance(cgroup, cgroups.Unavailable) else f" ({cgroup.version})"
    places = [f"/tmp {render_memory(bounds.tmp_bytes)}", f"/run {render_memory(bounds.run_bytes)}"]
    places.append(f"/dev/shm {render_memory(bounds.shm_bytes)}")
    missing: list[str] = []
    if bounds.workspace_bytes is not None:
        places.insert(0, f"/workspace {render_memory(bounds.workspace_bytes)}")
    else:
        missing.append("/workspace disk use (local.workspace_size is empty)")
    enforced = [f"{', '.join(places)} (tmpfs)", f"file size {render_memory(bounds.file_bytes)} (rlimit)"]
    enforced.append(f"{bounds.open_files} open files per process (rlimit)")
    if "pids" in controllers:
        enforced.append(f"{bounds.processes} processes{by}")
    elif uid_per_sandbox:
        enforced.append(f"{bounds.processes} processes (rlimit)")
    else:
        missing.append("process count (sandboxes share the gateway's uid)")
    if bounds.file_budget is not None and bounds.open_files * bounds.processes > bounds.file_budget:
        missing.append(f"open files of all its processes together ({bounds.processes} x {bounds.open_files})")
    for name, amount in (
        ("memory", None if bounds.memory_bytes is None else render_memory(bounds.memory_bytes)),
        ("cpu", None if bounds.cpu_millis is None else render_cpu(bounds.cpu_millis)),
    ):
        if amount is None:
            missing.append(f"{name} (no limit configured)")
        elif name in controllers:
            enforced.append(f"{name} {amount}{by}")
        else:
            missing.append(f"{name} {amount}")
    why = f" ({cgroup.message})" if isinstance(cgroup, cgroups.Unavailable) else ""
    if not missing:
        return DriverCondition("ResourceLimits", "True", "Enforced", f"enforced: {'; '.join(enforced)}.")
    reason = "CgroupUnavailable" if why else "PartlyEnforced"
    message = f"enforced: {'; '.join(enforced)}. Not enforced: {', '.join(missing)}{why}."
    return DriverCondition("ResourceLimits", "False", reason, message)


def enforceable(
    cgroup: cgroups.Backend | cgroups.Unavailable, *, isolated: bool, uid_per_sandbox: bool
) -> frozenset[str]:
    """Which of a request's cpu, memory and pids this host can enforce (pure): those of the
    cgroup's controllers, and the process count by rlimit where each sandbox has its own uid."""
    if not isolated:
        return frozenset()
    return (_controllers(cgroup) & {"cpu", "memory", "pids"}) | ({"pids"} if uid_per_sandbox else set())


def _controllers(cgroup: cgroups.Backend | cgroups.Unavailable) -> frozenset[str]:
    return frozenset() if isinstance(cgroup, cgroups.Unavailable) else cgroup.controllers


def unenforced_field(spec: SandboxSpec, enforced: frozenset[str]) -> str | None:
    """The first resource the spec asks for explicitly that is not enforced here (pure), as
    its field name; None when every one asked for is."""
    resources = spec.resources
    for name, asked in (("memory", resources.memory_bytes), ("cpu", resources.cpu_millis), ("pids", resources.pids)):
        if asked and name not in enforced:
            return f"spec.resources.{name}"
    return None


@dataclass(frozen=True)
class Maximums:
    """The most a request or profile may ask for, in amounts: the configured maximums read once
    (when the driver is made), an unset one being the host's size (storage is tmpfs, so memory)."""

    cpu_millis: int
    memory_bytes: int
    pids: int
    storage_bytes: int

    @classmethod
    def of(cls, config: LocalDriverConfig, *, host_cpus: int, host_memory: int) -> Maximums:
        """`[local]`'s `max_cpu`, `max_memory`, `max_pids`, `max_storage_size` on this host."""
        return cls(
            cpu_millis=cpu_millis(config.max_cpu, field="local.max_cpu") if config.max_cpu else host_cpus * 1000,
            memory_bytes=_size(config.max_memory, "local.max_memory") or host_memory,
            pids=config.max_pids,
            storage_bytes=_size(config.max_storage_size, "local.max_storage_size") or host_memory,
        )


def check_maximum(spec: SandboxSpec, most: Maximums) -> None:
    """A request or profile over the maximum is refused, naming the field and the rule."""
    resources, storage = spec.resources, spec.storage
    if resources.cpu_millis > most.cpu_millis:
        raise InvalidArgumentError(
            "spec.resources.cpu", f"{resources.cpu!r} is more than this gateway allows ({most.cpu_millis}m)"
        )
    _at_most("spec.resources.memory", resources.memory_bytes, most.memory_bytes)
    if resources.pids > most.pids:
        raise InvalidArgumentError(
            "spec.resources.pids", f"{resources.pids} is more than this gateway allows ({most.pids})"
        )
    _at_most("storage.workspace", storage.workspace_bytes, most.storage_bytes)
    _at_most("storage.tmp", storage.tmp_bytes, most.storage_bytes)
    _at_most("storage.root", storage.root_bytes, most.storage_bytes)


def _at_most(field: str, size: int, most: int) -> None:
    if size > most:
        shown = render_memory(size)
        raise InvalidArgumentError(field, f"{shown!r} is more than this gateway allows ({render_memory(most)})")
