"""What the local driver needs from this host, worked out once from its config when the driver is
made: bubblewrap (or unisolated mode), whether each sandbox gets its own uid (the gateway runs as
root), the launcher every sandbox starts through with its resource bounds, the cgroups enforcing
them (and so which of a request's resources are enforceable), the maximums a spec is checked
against (the host's size where unset), and the nice value refills start at.
`LocalDriver.__init__` builds its fleet and pools from a `HostSetup`; nothing in it changes after.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import FailedPreconditionError
from warmshell.drivers.base import DriverCondition
from warmshell.drivers.local.imagestore import store
from warmshell.drivers.local.runtime import cgroups, cgroupsetup, imageroots, limits, runtimedir
from warmshell.drivers.local.runtime.launching import Launcher
from warmshell.drivers.local.runtime.uidlease import UidLeases

__all__ = ["NO_BWRAP", "HostSetup"]

# What this says is the driver's start-up: under the driver's logger, where it has always been.
_log = logging.getLogger("warmshell.drivers.local.driver")

NO_BWRAP = (
    "bubblewrap ({bwrap!r}) was not found; install it (Debian/Ubuntu: apt-get install bubblewrap) "
    "or set local.allow_unisolated = true to run workloads as plain, unisolated processes"
)
DEPRECATED_REFILL_DELAY = (
    "local.refill_delay_seconds is deprecated and ignored: refills now wait only while claims are in "
    "flight and start at a lower CPU priority (local.refill_nice); remove the key"
)


@dataclass(frozen=True)
class HostSetup:
    """The host-derived settings of one local driver (see the module docstring)."""

    launcher: Launcher
    cgroup: cgroups.Backend | cgroups.Unavailable
    root: bool  # then each sandbox gets its own uid (see `uids`) and its workspace under sandbox_dir
    uids: UidLeases | None
    workspaces: Path | None
    runtime: Path | None  # with a uid per sandbox, its egress directory and uid lease (`runtimedir`)
    logs: Path | None  # in `runtime`, this gateway's: the logs of instances with nothing on disk
    refill_nice: int
    maximums: limits.Maximums  # read once here, checked on every create and profile
    image_roots: tuple[Path, ...] = ()  # `local.image_roots`, resolved once here
    enforceable: frozenset[str] = frozenset()  # of cpu, memory, pids: what a request may ask for
    allow_unenforced_limits: bool = False  # `local.allow_unenforced_limits`

    @classmethod
    def of(
        cls,
        config: LocalDriverConfig,
        paths: StatePaths,
        *,
        agent: Path,
        cgroup: cgroups.Backend | cgroups.Unavailable | None,
    ) -> HostSetup:
        """Check the config against this host (FailedPreconditionError without bubblewrap unless
        `config.allow_unisolated`, or with an extra bind over the state directory) and settle
        the settings; `cgroup` None: detect it."""
        bwrap = _bwrap(config)
        _check_extra_binds(config.extra_ro_binds, paths)
        image_roots = _image_roots(config.image_roots, paths)
        root = os.geteuid() == 0
        bounds = limits.Bounds.of(config, host_file_max=_file_max())
        launcher = _launcher(config, paths, bwrap=bwrap, agent=agent, root=root, bounds=bounds)
        gateway = runtimedir.gateway_named(paths.root.resolve())  # where the host's gateways share something
        cgroup = cgroup if cgroup is not None else cgroupsetup.choose(gateway=gateway)
        runtime = runtimedir.choose(config.runtime_dir, config.sandbox_dir, runtimedir.host_tmpfs()) if root else None
        if bwrap is not None:  # once, at start; each sandbox's ResourceLimits condition says it again
            _say_bounds(limits.condition(bounds, cgroup, uid_per_sandbox=root))
        return cls(
            launcher=launcher,
            cgroup=cgroup,
            root=root,
            uids=_uids(config, runtime, gateway) if runtime is not None else None,
            workspaces=config.sandbox_dir if root else None,
            runtime=runtime,
            logs=runtime / gateway if runtime is not None else None,
            refill_nice=_refill_nice(config),
            maximums=limits.Maximums.of(
                config,
                host_cpus=os.cpu_count() or 1,
                host_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            ),
            image_roots=image_roots,
            enforceable=limits.enforceable(cgroup, isolated=bwrap is not None, uid_per_sandbox=root),
            allow_unenforced_limits=config.allow_unenforced_limits,
        )


def _uids(config: LocalDriverConfig, runtime: Path, gateway: str) -> UidLeases:
    return UidLeases(runtime, config.sandbox_uid_base, config.sandbox_uid_count, gateway=gateway)


def _file_max() -> int | None:
    """The host's file table size (fs.file-max); None where it cannot be read."""
    try:
        return int(Path("/proc/sys/fs/file-max").read_text())
    except (OSError, ValueError):
        return None


def _bwrap(config: LocalDriverConfig) -> str | None:
    """bubblewrap's path; None only when unisolated mode is allowed."""
    bwrap = shutil.which(config.bwrap)
    if bwrap is None and not config.allow_unisolated:
        raise FailedPreconditionError(NO_BWRAP.format(bwrap=config.bwrap))
    return bwrap


def _launcher(
    config: LocalDriverConfig, paths: StatePaths, *, bwrap: str | None, agent: Path, root: bool, bounds: limits.Bounds
) -> Launcher:
    return Launcher(
        bwrap=bwrap,
        agent=agent,
        extra_ro_binds=config.extra_ro_binds,
        stage_dir=config.sandbox_dir if root else None,
        bounds=bounds,
        etc_dir=_etc_dir(config, paths, root=root),
        images=imageroots.ImageRoots(store.for_config(config, paths)),
        rootfs=config.sandbox_dir / "rootfs" if root else paths.root / "rootfs",
    )


def _say_bounds(bounded: DriverCondition) -> None:
    level = logging.INFO if bounded.status == "True" else logging.WARNING
    _log.log(level, "local sandboxes: %s", bounded.message)


def _check_extra_binds(binds: Sequence[Path], paths: StatePaths) -> None:
    """An extra bind must not expose the gateway's state directory (its secrets, every sandbox)."""
    state = paths.root.resolve()
    for bind in binds:
        source = bind.resolve()
        if source == state or source in state.parents or state in source.parents:
            raise FailedPreconditionError(
                f"local.extra_ro_binds: {str(bind)!r} overlaps the gateway's state directory {str(state)!r}"
            )


def _image_roots(roots: Sequence[Path], paths: StatePaths) -> tuple[Path, ...]:
    """The image roots, resolved (a symlinked root is checked against where it leads); one that
    overlaps the gateway's state directory is refused, as an extra bind is."""
    state = paths.root.resolve()
    resolved = tuple(root.resolve() for root in roots)
    for root, source in zip(roots, resolved, strict=True):
        if source == state or source in state.parents or state in source.parents:
            raise FailedPreconditionError(
                f"local.image_roots: {str(root)!r} overlaps the gateway's state directory {str(state)!r}"
            )
    return resolved


def _etc_dir(config: LocalDriverConfig, paths: StatePaths, *, root: bool) -> Path:
    """Where the sandboxes' /etc is staged: where their uid can reach it, as their workspaces
    (see `launching`), and one per gateway (gateways may share `local.sandbox_dir`)."""
    if not root:
        return paths.root / "sandbox-etc"
    return config.sandbox_dir / f"etc-{_state_digest(paths)}"


def _state_digest(paths: StatePaths) -> str:
    """A gateway's name on this host, for what gateways share (`local.sandbox_dir`, the cgroup
    hierarchies): its state directory, of which only one gateway runs at a time."""
    return runtimedir.digest_of(paths.root.resolve())


def _refill_nice(config: LocalDriverConfig) -> int:
    """The nice value refills start at, if the gateway may give a claimed member nice 0 back
    (root, or an RLIMIT_NICE that allows it); else 0, said once. The deprecated refill delay is
    said here too: refill timing is the nice value's job now."""
    if config.refill_delay_seconds is not None:
        _log.warning(DEPRECATED_REFILL_DELAY)
    nice = config.refill_nice
    if nice and os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20:
        _log.info("local.refill_nice = %d not applied: this user may not raise a claimed member's priority again", nice)
        return 0
    return nice
