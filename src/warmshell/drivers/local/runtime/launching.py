"""Starts the sandbox of an instance: bubblewrap around the agent when isolated, nothing but the
supervisor's own child processes otherwise.

Unisolated mode (`local.allow_unisolated`, used only when bwrap is missing) runs every workload
as an ordinary process of the gateway's user: it sees and can change the whole host, including
the gateway's state directory and API token, and shares its network. It is for development
machines without bubblewrap, never for untrusted workloads.

bwrap resolves its bind sources as the uid it runs as. A gateway run as root runs each sandbox
as its own uid, which cannot traverse a 0700 home or state directory; so there the workspaces
live under `local.sandbox_dir` (root-owned, 0711: nobody can list it, each workspace inside is
0700 and owned by its sandbox's uid) and the agent binary is copied there once (root-owned,
0755). A gateway run by a normal user keeps both where they are.

An image of the image store (see `imageroots`) is mounted by `warmshell-launch`: as root, its
layers idmapped to the sandbox's uid; otherwise in a user namespace of its own where the gateway's
uid (the store's owner) is 0. Its mount point (`local.sandbox_dir`/rootfs as root, the state
directory's `rootfs` otherwise) is shared by all: each launch mounts its own tmpfs there, in a
mount namespace of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from warmshell.core import egress
from warmshell.core.errors import FailedPreconditionError
from warmshell.drivers.local.runtime import cgroups, etcstage, imageroots, limits, sandboxing, seccomp
from warmshell.drivers.local.runtime.agent import building
from warmshell.drivers.local.runtime.processes import HostProcesses, SandboxFds, SandboxProcess, Spawner

__all__ = ["AGENT_BINARY", "BUILD_STEP", "ETC_REFRESH_SECONDS", "LAUNCH_BINARY", "Launchable", "Launcher", "Sandbox"]

_log = logging.getLogger(__name__)

AGENT_BINARY = Path(__file__).resolve().parent / "agent" / "warmshell-agent"
# Sets a sandbox's nice value and rlimits and drops to its uid, then execs bwrap (see its source).
LAUNCH_BINARY = AGENT_BINARY.with_name("warmshell-launch")
BUILD_STEP = building.HOW
_HOST_ROOT = Path("/")
# How long a staged /etc is trusted before the next start checks its sources again.
ETC_REFRESH_SECONDS = 1.0
Sandbox = SandboxProcess | HostProcesses
_NO_PLAN = sandboxing.RootPlan(())


class Launchable(Protocol):
    """What a start reads of the instance it starts (the driver's `Instance` is one)."""

    @property
    def instance_id(self) -> str:
        """Set in the sandbox's environment (the start-up sweep finds survivors by it)."""
        ...

    @property
    def hostname(self) -> str:
        """The sandbox's hostname."""
        ...

    @property
    def bounds(self) -> limits.Bounds | None:
        """Its own bounds (None: the launcher's defaults)."""
        ...

    @property
    def cgroup(self) -> cgroups.Group | None:
        """The cgroup it starts in (None: none); set by `prepare`."""
        ...

    @property
    def uid(self) -> int | None:
        """The host uid it runs as (None: the gateway's); set by `prepare`."""
        ...

    @property
    def workspace_dir(self) -> Path:
        """The host directory bound at /workspace."""
        ...

    @property
    def image_root(self) -> imageroots.ImageRoot | None:
        """The stored image it runs (None: the host root or an image root directory); set by
        `prepare`."""
        ...

    @property
    def log_path(self) -> Path:
        """Where bwrap's stdout and stderr go."""
        ...

    @property
    def egress_dir(self) -> Path:
        """The host directory bound at `sandboxing.EGRESS_DIR` (made by `prepare`)."""
        ...


def _nothing() -> None:
    pass


class Launcher:
    """Builds and starts each instance's sandbox."""

    def __init__(
        self,
        *,
        bwrap: str | None,
        agent: Path = AGENT_BINARY,
        extra_ro_binds: Sequence[Path] = (),
        stage_dir: Path | None = None,
        bounds: limits.Bounds | None = None,
        launch: Path = LAUNCH_BINARY,
        etc_dir: Path | None = None,
        images: imageroots.ImageRoots | None = None,
        rootfs: Path | None = None,
    ) -> None:
        """`bwrap` None means unisolated; `stage_dir` is where the agent is copied for sandboxes
        whose uid cannot reach it (None: use it in place); `etc_dir` is where the host root's
        /etc is staged (see `etcstage`; None: each allowed entry is bound on its own); `images`
        resolves and holds images of the image store (None: this launcher has none), mounted on
        `rootfs` (None: `stage_dir`/rootfs).
        FailedPreconditionError when isolated and the agent or launch binary is missing (they
        are built, not shipped)."""
        self.bwrap = bwrap
        self._agent = agent
        self._extra = list(extra_ro_binds)
        self._stage_dir = stage_dir
        self._bounds = bounds
        self._launch = launch
        self.images = images
        self._rootfs = rootfs if rootfs is not None else stage_dir / "rootfs" if stage_dir is not None else None
        # One stage for all: `prepare` runs in several threads at once.
        self._etc = etcstage.EtcStage(etc_dir, _HOST_ROOT / "etc", sandboxing.ETC_ALLOWED) if etc_dir else None
        self._etc_fresh_until = float("-inf")
        self._plans: dict[Path, sandboxing.RootPlan] = {}
        self._preparing = threading.Lock()
        self._seccomp = b""
        self._spawner = Spawner("warmshell-spawn")
        if bwrap is not None:
            for binary in (agent, launch):
                if not os.access(binary, os.X_OK):
                    raise FailedPreconditionError(
                        f"{str(binary)!r} is missing or not executable; build it with {BUILD_STEP}"
                    )
            self._seccomp = seccomp.program()
            for path in self._extra:
                _log.info("local sandboxes get a read-only bind of %s (local.extra_ro_binds)", path)

    @property
    def bounds(self) -> limits.Bounds | None:
        """The default bounds every sandbox gets (None: none, as in tests of the layout alone)."""
        return self._bounds if self.bwrap is not None else None

    @property
    def isolated(self) -> bool:
        """Whether sandboxes run under bubblewrap."""
        return self.bwrap is not None

    def prepare(self, image: str) -> None:
        """Blocking (call through a thread; several may call it at once): plan the root
        filesystem once per image, stage the agent once."""
        if self.bwrap is None:
            return
        with self._preparing:  # the first starts stage the agent and plan the root once, not each
            self._prepare(image)

    def _prepare(self, image: str) -> None:
        if self._stage_dir is not None and self._agent.parent != self._stage_dir:
            self._agent = _stage(self._agent, self._stage_dir)
        if imageroots.is_reference(image):
            if self._rootfs is not None and not self._rootfs.is_dir():
                traversable_dir(self._rootfs)
            return
        root = Path(image) if image else _HOST_ROOT
        if not image and self._etc is not None and time.monotonic() >= self._etc_fresh_until:
            # A changed /etc/resolv.conf reaches the sandboxes started from a second later on; a
            # check per start was a tenth of a millisecond of every member's start in a fill.
            self._etc.refresh()
            self._etc_fresh_until = time.monotonic() + ETC_REFRESH_SECONDS
        if root not in self._plans:
            entries = sandboxing.list_root(root)
            if image:
                self._plans[root] = sandboxing.image_root_plan(root, entries)
            else:
                staged, subdirs = (self._etc.directory, self._etc.subdirectories) if self._etc else (None, ())
                names = os.listdir(root / "etc")
                self._plans[root] = sandboxing.host_root_plan(entries, names, root, staged_etc=staged, etc_dirs=subdirs)

    async def start(
        self, instance: Launchable, *, image: str, nice: int = 0, prepare: Callable[[], None] = _nothing
    ) -> Sandbox:
        """Start the instance's sandbox at nice value `nice`, as `instance.uid` once prepared;
        OSError when it does not. `prepare` (blocking: the instance's uid, directories and cgroup,
        and `self.prepare(image)`) runs first, in a spawner thread right before the spawn: one
        thread hop per start."""
        log_path = instance.log_path
        if self.bwrap is None:
            await asyncio.to_thread(prepare)
            return HostProcesses(instance.workspace_dir, log_path)
        bwrap = self.bwrap

        def build(fds: SandboxFds) -> list[str]:
            prepare()
            bounds = instance.bounds or self._bounds
            image_root = instance.image_root
            plan = _NO_PLAN if image_root is not None else self._plans[Path(image) if image else _HOST_ROOT]
            layout = sandboxing.SandboxLayout(
                bwrap=bwrap,
                plan=plan,
                overlay_root=self._rootfs / "m" if image_root is not None and self._rootfs is not None else None,
                uid=image_root.uid if image_root is not None else 0,
                gid=image_root.gid if image_root is not None else None,
                workspace_dir=instance.workspace_dir,
                agent=self._agent,
                control_fd=fds.control,
                seccomp_fd=fds.seccomp,
                hostname=instance.hostname,
                info_fd=fds.info,
                extra_ro_binds=self._extra,
                instance_id=instance.instance_id,
                workspace_bytes=bounds.workspace_bytes if bounds is not None else None,
                tmp_bytes=bounds.tmp_bytes if bounds is not None else None,
                run_bytes=bounds.run_bytes if bounds is not None else None,
                shm_bytes=bounds.shm_bytes if bounds is not None else None,
                egress_dir=instance.egress_dir,
                egress_port=egress.PROXY_PORT,
                workspace_in_root=image_root is not None and image_root.workspace,
            )
            if image_root is None and not image and self._etc is not None and self._etc.bundle_linked:
                etcstage.link_system_bundle(instance.egress_dir)
            keep = sandboxing.kept_mounts(layout) if instance.uid is not None else None
            launch = self._launch_argv(nice, instance.uid, bounds, instance.cgroup, image_root, keep)
            return [*launch, *sandboxing.bwrap_argv(layout)]

        return await SandboxProcess.spawn(build, seccomp=self._seccomp, log_path=log_path, spawner=self._spawner)

    def _launch_argv(
        self,
        nice: int,
        uid: int | None,
        bounds: limits.Bounds | None,
        cgroup: cgroups.Group | None = None,
        image_root: imageroots.ImageRoot | None = None,
        keep: tuple[Sequence[str], Sequence[str]] | None = None,
    ) -> list[str]:
        """The `warmshell-launch` prefix: into the cgroup while still the gateway's uid, then
        priority, rlimits and the sandbox's uid, then bwrap (not subprocess's `user=`: that makes
        Python fork() instead of vfork(), and a fork of the gateway runs gRPC's fork handlers,
        which crash the child while other threads use gRPC). With `keep` (a root gateway's:
        `sandboxing.kept_mounts`), the mounts bwrap neither binds nor reads leave its namespace."""
        argv = [str(self._launch)]
        if cgroup is not None:  # one file per hierarchy on cgroup v1
            argv += [f"--cgroup={entry}" for entry in cgroup.entry_files]
        if nice:
            argv.append(f"--priority={nice}")
        if bounds is not None:
            argv += limits.rlimit_options(bounds, uid_per_sandbox=uid is not None)
        if uid is not None:
            argv.append(f"--uid={uid}")
        if image_root is not None and self._rootfs is not None:
            size = bounds.root_bytes if bounds is not None else limits.DEFAULT_ROOT_BYTES
            argv += [f"--rootfs={self._rootfs}", f"--root-size={size}"]
            argv += [f"--layer={layer}" for layer in image_root.layers]
        if keep is not None:
            argv += [*(f"--keep-tree={tree}" for tree in keep[0]), *(f"--keep={path}" for path in keep[1])]
        return [*argv, "--"] if len(argv) > 1 else []

    def share_authority(self, certificate_pem: bytes) -> None:
        """Blocking: the gateway's egress CA placed once in the staged /etc, for the sandboxes
        on the host's root whose activation intercepts TLS (`etcstage.EtcStage.trust`)."""
        if self._etc is not None:
            self._etc.trust(certificate_pem)

    def overlay_dirs(self, pid: int) -> tuple[Path, Path] | None:
        """The writable upper layer and the merged root of an image sandbox's overlay, reached
        through the mount namespace of its launcher (`pid`, bwrap's outer process, which stays
        in it); None when this launcher mounts no image roots."""
        if self._rootfs is None:
            return None
        base = Path(f"/proc/{pid}/root") / self._rootfs.relative_to("/")
        return base / "u", base / "m"

    def close(self) -> None:
        """Let the spawner threads end and remove the staged /etc (blocking: call once every
        sandbox ended). A gateway that crashed leaves it; its next start makes it afresh."""
        self._spawner.close()
        if self._etc is not None:
            self._etc.remove()


def traversable_dir(path: Path) -> None:
    """Create `path` root-owned 0711 (blocking); refuse one another uid owns or can write."""
    path.mkdir(mode=0o711, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(f"{path} must be owned by uid {os.geteuid()} and writable by nobody else")
    if info.st_mode & 0o777 != 0o711:
        os.chmod(path, 0o711)


def _stage(agent: Path, stage_dir: Path) -> Path:
    """Copy the agent into `stage_dir` under a name that changes with its content (blocking).
    The directory is made here: on a new host the first sandbox may have no workspace on disk
    (which would have made it)."""
    traversable_dir(stage_dir)
    digest = hashlib.sha256(agent.read_bytes()).hexdigest()[:16]
    target = stage_dir / f"warmshell-agent-{digest}"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(agent, partial)
        os.chmod(partial, 0o755)
        partial.replace(target)
    return target
