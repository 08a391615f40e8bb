"""How one local sandbox is laid out: the bubblewrap command line around its agent (pure).

Pure functions over plain data (plus `list_root`, the one directory scan they need), so every
isolation flag is unit-tested. The root is an empty tmpfs that gets only what a program needs:
for the host's root filesystem an allow-list (`/usr`, the `/bin`, `/sbin`, `/lib*` entries, a
filtered `/etc`), for an image root every top-level entry of the image. Then a fresh `/proc`, a
minimal `/dev`, private sized tmpfs `/tmp`, `/run` and `/dev/shm`, the sandbox's own writable
`/workspace` (a sized tmpfs, or a host directory bound there), the
operator's `extra_ro_binds`, and the agent at `AGENT_PATH`; finally the root itself is remounted
read-only. bwrap resolves every bind source as the sandbox's uid, so with a uid per sandbox the
workspace and the agent live where that uid can reach them (see `launching`).

An image of the image store is different: `warmshell-launch` has mounted its overlay (the
image's layers under a writable upper layer of the sandbox's own) before bwrap runs, and that is
bound as `/` and stays writable; the rest is laid on top of it as for any root.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from warmshell.core import egress
from warmshell.core.models import WORKSPACE_DIR

__all__ = [
    "AGENT_PATH",
    "EGRESS_DIR",
    "ETC_ALLOWED",
    "HOST_ROOT_DIRS",
    "WORKSPACE",
    "RootEntry",
    "RootPlan",
    "SandboxLayout",
    "bwrap_argv",
    "host_root_plan",
    "image_root_plan",
    "kept_mounts",
    "list_root",
]

WORKSPACE = WORKSPACE_DIR
AGENT_PATH = "/run/warmshell/agent"
# A directory of the gateway's, bound read-only: the proxy's socket appears in it at activation
# (a connect needs no write access to the mount), and the agent relays to it.
EGRESS_DIR = egress.SANDBOX_DIR
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

# Top-level entries of the host root a program needs (a directory is bound, a symlink such as
# merged-/usr's `bin -> usr/bin` is recreated).
HOST_ROOT_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc entries that name the system, its users and its network, find libraries and certificates.
# Never: shadow, gshadow, sudoers, ssh host keys, machine-id, or tool configs (pip.conf, npmrc,
# gitconfig) that may hold tokens.
ETC_ALLOWED = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf",
    "group", "host.conf", "hosts", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias",
    "localtime", "mime.types", "networks", "nsswitch.conf", "os-release", "passwd", "profile", "protocols",
    "python3", "resolv.conf", "services", "ssl", "timezone", "xdg",
)  # fmt: skip
# Top-level names of an image root the sandbox gets fresh instead.
_REPLACED = frozenset({"dev", "proc", "sys", "tmp", "run", WORKSPACE.lstrip("/")})


@dataclass(frozen=True)
class RootEntry:
    """One top-level entry of a root filesystem: a directory, or a symlink (`bin -> usr/bin`)."""

    name: str
    symlink_target: str | None = None


@dataclass(frozen=True)
class RootPlan:
    """What of a root filesystem a sandbox sees: read-only binds (host path -> sandbox path),
    symlinks (target, sandbox path) and empty directories, applied in this order."""

    binds: tuple[tuple[Path, str], ...]
    symlinks: tuple[tuple[str, str], ...] = ()
    dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxLayout:
    """Everything `bwrap_argv` needs; paths are host paths unless the field says otherwise."""

    bwrap: str
    plan: RootPlan
    workspace_dir: Path
    agent: Path
    control_fd: int  # the agent's end of the control socket
    seccomp_fd: int
    hostname: str
    info_fd: int | None = None  # bwrap writes {"child-pid": ...} here
    uid: int = 0  # the uid inside the sandbox's user namespace
    gid: int | None = None  # and its gid (None: the uid)
    extra_ro_binds: Sequence[Path] = ()  # local.extra_ro_binds, at the same paths, after /tmp and /run
    # Not a secret: lets a later gateway find a survivor of this one by its argv.
    instance_id: str = ""
    # Size of /workspace as a tmpfs (None: `workspace_dir` bound there instead).
    workspace_bytes: int | None = None
    # Sizes of the sandbox's tmpfs /tmp, /run and /dev/shm (None: the kernel's default, half of RAM).
    tmp_bytes: int | None = None
    run_bytes: int | None = None
    shm_bytes: int | None = None
    # The host directory bound at EGRESS_DIR, and the port the agent listens on (None: no way out).
    egress_dir: Path | None = None
    egress_port: int = 0
    # The host path of an image's overlay, bound writable as / (None: `plan` on a read-only tmpfs).
    overlay_root: Path | None = None
    # /workspace is the overlay root's own (an image that holds one, a snapshot's): nothing is
    # mounted there, so a sandbox's writes go to its writable layer over the image's copy.
    workspace_in_root: bool = False


def list_root(root: Path) -> list[RootEntry]:
    """The top-level directories and symlinks of a root filesystem, sorted by name."""
    entries: list[RootEntry] = []
    with os.scandir(root) as scan:
        for item in scan:
            if item.is_symlink():
                entries.append(RootEntry(item.name, os.readlink(item.path)))
            elif item.is_dir(follow_symlinks=False):
                entries.append(RootEntry(item.name))
    return sorted(entries, key=lambda entry: entry.name)


def _entry_plan(root: Path, entries: Sequence[RootEntry], keep: frozenset[str] | None) -> RootPlan:
    binds: list[tuple[Path, str]] = []
    symlinks: list[tuple[str, str]] = []
    for entry in entries:
        if entry.name in _REPLACED or entry.name == "etc" or (keep is not None and entry.name not in keep):
            continue
        if entry.symlink_target is not None:
            symlinks.append((entry.symlink_target, f"/{entry.name}"))
        else:
            binds.append((root / entry.name, f"/{entry.name}"))
    return RootPlan(tuple(binds), tuple(symlinks))


def host_root_plan(
    entries: Sequence[RootEntry],
    etc_names: Sequence[str],
    root: Path = Path("/"),
    *,
    staged_etc: Path | None = None,
    etc_dirs: Sequence[str] = (),
) -> RootPlan:
    """The allow-listed part of the host's root: `HOST_ROOT_DIRS` among `entries`, and the
    `ETC_ALLOWED` names among `etc_names` (what the host's /etc holds). With `staged_etc` (a
    copy of the allowed entries, see `etcstage`) that directory is bound at /etc, and the
    allowed directories among `etc_dirs` (too big to copy) are bound into it, one each; without
    it, each allowed entry is bound on its own."""
    base = _entry_plan(root, entries, frozenset(HOST_ROOT_DIRS))
    allowed = sorted(set(etc_names) & set(ETC_ALLOWED))
    if staged_etc is not None:
        subdirs = tuple((root / "etc" / name, f"/etc/{name}") for name in allowed if name in etc_dirs)
        return RootPlan((*base.binds, (staged_etc, "/etc"), *subdirs), base.symlinks)
    etc = tuple((root / "etc" / name, f"/etc/{name}") for name in allowed)
    return RootPlan(base.binds + etc, base.symlinks, ("/etc",))


def image_root_plan(root: Path, entries: Sequence[RootEntry]) -> RootPlan:
    """An image root is the operator's chosen filesystem, not the host's: all of it (but the
    entries the sandbox gets fresh), `/etc` included."""
    plan = _entry_plan(root, entries, None)
    etc = ((root / "etc", "/etc"),) if any(e.name == "etc" and e.symlink_target is None for e in entries) else ()
    return RootPlan(plan.binds + etc, plan.symlinks)


def bwrap_argv(layout: SandboxLayout) -> list[str]:
    """The full bubblewrap command line for one sandbox, its agent as pid 1."""
    argv = [
        layout.bwrap,
        "--unshare-user",
        "--uid", str(layout.uid),
        "--gid", str(layout.uid if layout.gid is None else layout.gid),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        # The gateway is the parent: sandboxes never outlive it (their records are reported as
        # lost on the next start). The agent also ends the sandbox when its socket closes.
        "--die-with-parent",
        # A new session keeps the workload away from the gateway's controlling terminal (TIOCSTI).
        "--new-session",
        # The agent is pid 1: it reaps, and its exit ends the pid namespace.
        "--as-pid-1",
        # No capabilities, not even inside the sandbox's own user namespace.
        "--cap-drop", "ALL",
        "--seccomp", str(layout.seccomp_fd),
    ]  # fmt: skip
    if layout.info_fd is not None:
        argv += ["--info-fd", str(layout.info_fd)]
    if layout.overlay_root is not None:
        argv += ["--bind", str(layout.overlay_root), "/"]
    for directory in layout.plan.dirs:
        argv += ["--dir", directory]
    for source, target in layout.plan.binds:
        argv += ["--ro-bind", str(source), target]
    for link_target, target in layout.plan.symlinks:
        argv += ["--symlink", link_target, target]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for size, target in ((layout.tmp_bytes, "/tmp"), (layout.run_bytes, "/run"), (layout.shm_bytes, "/dev/shm")):
        argv += [*(["--size", str(size)] if size is not None else []), "--tmpfs", target]
    # /dev's own tmpfs cannot be sized: read-only instead (device nodes still work).
    argv += ["--remount-ro", "/dev"]
    for path in layout.extra_ro_binds:
        argv += ["--ro-bind", str(path), str(path)]
    argv += _workspace_argv(layout)
    argv += ["--ro-bind", str(layout.agent), AGENT_PATH]
    if layout.egress_dir is not None:
        argv += ["--ro-bind", str(layout.egress_dir), EGRESS_DIR]
    if layout.overlay_root is None:
        argv += ["--remount-ro", "/"]
    argv += ["--hostname", layout.hostname, "--chdir", WORKSPACE, "--clearenv", "--setenv", "PATH", SANDBOX_PATH]
    if layout.instance_id:
        argv += ["--setenv", "WARMSHELL_INSTANCE_ID", layout.instance_id]
    argv += ["--", AGENT_PATH, str(layout.control_fd)]
    if layout.egress_dir is not None:
        argv.append(str(layout.egress_port))
    return argv


# What bwrap reads of the namespace it starts in besides its bind sources: /tmp (its base
# directory until it pivots), the device nodes its --dev binds, and its own program and libraries.
_BWRAP_READS = ("/tmp", *(f"/dev/{node}" for node in ("null", "zero", "full", "random", "urandom", "tty")))
_PROGRAM_READS = ("/usr", "/lib", "/lib64", "/etc")
# /proc with its submounts: the kernel lets bwrap mount a fresh proc for the sandbox only when an
# existing one is as covered as before (a container masks /proc/kcore and others with submounts:
# detached, they would no longer refuse it).
_PROC = "/proc"


def kept_mounts(layout: SandboxLayout) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What of its mount namespace a sandbox's launcher keeps for bwrap (`warmshell-launch`'s
    `--keep-tree` and `--keep`): the trees bwrap binds (every source of `bwrap_argv`, with the
    mounts within it) and /proc's, and the paths it reads otherwise (only the mounts holding
    them). Every other mount goes: bwrap parses the whole mount table once per bind mount."""
    trees = [_PROC, *(source for source, _ in layout.plan.binds), *layout.extra_ro_binds, layout.agent]
    if layout.overlay_root is not None:
        trees.insert(1, layout.overlay_root)
    if not (layout.workspace_in_root and layout.overlay_root is not None) and layout.workspace_bytes is None:
        trees.append(layout.workspace_dir)
    if layout.egress_dir is not None:
        trees.append(layout.egress_dir)
    reads = (*_BWRAP_READS, layout.bwrap, *_PROGRAM_READS)
    return tuple(dict.fromkeys(str(tree) for tree in trees)), reads


def _workspace_argv(layout: SandboxLayout) -> list[str]:
    """How /workspace is mounted: a sized tmpfs, a host directory, or not at all (the overlay
    root's own, under the sandbox's writable layer)."""
    if layout.workspace_in_root and layout.overlay_root is not None:
        return []
    if layout.workspace_bytes is not None:
        # Mounted before the root is remounted read-only, owned by the sandbox's uid (bwrap's
        # mounts belong to the uid it maps), gone with the sandbox's mount namespace.
        return ["--size", str(layout.workspace_bytes), "--perms", "0700", "--tmpfs", WORKSPACE]
    return ["--bind", str(layout.workspace_dir), WORKSPACE]
