"""The default bounds of every local sandbox, and the `ResourceLimits` condition that says exactly
which of them are enforced (pure).

Always, under bubblewrap: sized tmpfs for `/tmp`, `/run` and `/dev/shm` (and `/dev` itself is
remounted read-only), a file-size rlimit on every process; with a uid per sandbox (a gateway run
as root) a process-count rlimit, which counts that uid's processes, i.e. that sandbox's alone.
Memory and cpu need a delegated cgroup v2 (`cgroups`); `/workspace` lives on the host's disk with
no quota. A sandbox that hits a bound gets ENOSPC, EFBIG or EAGAIN inside; nothing outside it is
affected.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmshell.core.config import LocalDriverConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import SandboxSpec
from warmshell.core.quantities import cpu_millis, memory_bytes, render_memory
from warmshell.drivers.base import DriverCondition
from warmshell.drivers.local import cgroups

__all__ = ["PRLIMIT", "Bounds", "check_maximum", "condition", "prlimit_argv"]

PRLIMIT = "/usr/bin/prlimit"  # util-linux, on every Debian


@dataclass(frozen=True)
class Bounds:
    """What bounds one sandbox's storage and processes (bytes; None = not enforced)."""

    tmp_bytes: int
    run_bytes: int
    shm_bytes: int
    file_bytes: int
    processes: int | None

    @classmethod
    def of(cls, config: LocalDriverConfig, *, uid_per_sandbox: bool) -> Bounds:
        """The configured bounds; the process count only where each sandbox has its own uid."""
        return cls(
            tmp_bytes=memory_bytes(config.tmp_size, field="local.tmp_size"),
            run_bytes=memory_bytes(config.run_size, field="local.run_size"),
            shm_bytes=memory_bytes(config.shm_size, field="local.shm_size"),
            file_bytes=memory_bytes(config.max_file_size, field="local.max_file_size"),
            processes=config.max_processes if uid_per_sandbox else None,
        )


def prlimit_argv(bounds: Bounds) -> list[str]:
    """A prefix that sets the sandbox's rlimits, then execs the rest (bwrap and all it starts
    inherit them; an rlimit cannot be raised again without CAP_SYS_RESOURCE)."""
    argv = [PRLIMIT, f"--fsize={bounds.file_bytes}"]
    if bounds.processes is not None:
        argv.append(f"--nproc={bounds.processes}")
    return [*argv, "--"]


def condition(bounds: Bounds, cgroup: cgroups.CgroupV2 | cgroups.Unavailable) -> DriverCondition:
    """`ResourceLimits`: True when memory and cpu are enforced by cgroup v2, else False; the
    message lists what is enforced and what is not."""
    enforced = [
        f"/tmp {render_memory(bounds.tmp_bytes)}, /run {render_memory(bounds.run_bytes)}, "
        f"/dev/shm {render_memory(bounds.shm_bytes)} (tmpfs)",
        f"file size {render_memory(bounds.file_bytes)} (rlimit)",
    ]
    missing = ["/workspace disk use"]
    if bounds.processes is not None:
        enforced.append(f"{bounds.processes} processes (rlimit)")
    else:
        missing.append("process count (sandboxes share the gateway's uid)")
    if isinstance(cgroup, cgroups.CgroupV2):
        enforced.append("memory and cpu as requested (cgroup v2)")
        status, reason, why = "True", "CgroupV2", ""
    else:
        missing.append("memory and cpu")
        status, reason, why = "False", "CgroupV2Unavailable", f" ({cgroup.message})"
    message = f"enforced: {'; '.join(enforced)}. Not enforced: {', '.join(missing)}{why}."
    return DriverCondition("ResourceLimits", status, reason, message)


def check_maximum(spec: SandboxSpec, config: LocalDriverConfig, *, host_cpus: int, host_memory: int) -> None:
    """A request over the configured maximum (default: the host's cpus and memory) is refused,
    naming the field."""
    cpu, memory = spec.resources.cpu, spec.resources.memory
    if cpu:
        most = cpu_millis(config.max_cpu, field="local.max_cpu") if config.max_cpu else host_cpus * 1000
        if cpu_millis(cpu, field="spec.resources.cpu") > most:
            raise InvalidArgumentError("spec.resources.cpu", f"{cpu!r} is more than this gateway allows ({most}m)")
    if memory:
        most = memory_bytes(config.max_memory, field="local.max_memory") if config.max_memory else host_memory
        if memory_bytes(memory, field="spec.resources.memory") > most:
            raise InvalidArgumentError(
                "spec.resources.memory", f"{memory!r} is more than this gateway allows ({render_memory(most)})"
            )
