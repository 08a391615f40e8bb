"""How one local sandbox is laid out: the bubblewrap argv and the supervisor's environment.

Pure functions over plain data (plus `list_root`, the one directory scan they need), so every
isolation flag is unit-tested. The layout: a fresh tmpfs root, read-only binds of each top-level
entry of the root filesystem (the host's `/` or an unpacked image directory), a private `/tmp`
and `/run`, the sandbox's own writable `/workspace`, and the gateway's supervisor socket at
`/run/warmshell/gateway.sock`; finally the root itself is remounted read-only. Binding entry by
entry rather than `--ro-bind / /` is what lets `/workspace` and `/run/warmshell` exist at all:
mount points cannot be created on a read-only bind of the host root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from warmshell.core.models import WORKSPACE_DIR

__all__ = [
    "GATEWAY_SOCKET",
    "WORKSPACE",
    "RootEntry",
    "SandboxLayout",
    "bwrap_argv",
    "list_root",
    "supervisor_environment",
]

WORKSPACE = WORKSPACE_DIR
GATEWAY_SOCKET = "/run/warmshell/gateway.sock"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

# Top-level names the sandbox gets fresh instead of from the root filesystem.
_REPLACED = frozenset({"dev", "proc", "tmp", "run", WORKSPACE.lstrip("/")})


@dataclass(frozen=True)
class RootEntry:
    """One top-level entry of a root filesystem: a directory, or a symlink (`bin -> usr/bin`)."""

    name: str
    symlink_target: str | None = None


@dataclass(frozen=True)
class SandboxLayout:
    """Everything `bwrap_argv` needs; paths are host paths unless the field says otherwise."""

    bwrap: str
    root: Path
    entries: Sequence[RootEntry]
    workspace_dir: Path
    supervisor_socket: Path
    hostname: str
    environment: Mapping[str, str]
    command: Sequence[str]
    # Host directories masked with an empty tmpfs, e.g. the gateway's state directory, which
    # holds the API token and the other sandboxes' records.
    hidden: Sequence[Path] = ()
    # (host directory, sandbox path) pairs bound read-only after the root: with an image root,
    # the gateway's interpreter and the warmshell package under /run/warmshell.
    extra_ro_binds: Sequence[tuple[Path, str]] = field(default_factory=tuple)
    # bwrap writes {"child-pid": ...} here, so the driver can kill the whole pid namespace.
    info_fd: int | None = None


def shadowed(path: Path) -> bool:
    """Whether the sandbox mounts something of its own over `path` (e.g. anything under /tmp),
    so a host path there must be bound explicitly to stay visible."""
    parts = path.resolve().parts
    return len(parts) > 1 and parts[1] in _REPLACED


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


def bwrap_argv(layout: SandboxLayout) -> list[str]:
    """The full bubblewrap command line for one sandbox."""
    argv = [
        layout.bwrap,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        # The gateway is the parent: sandboxes never outlive it (their records are reported as
        # lost on the next start).
        "--die-with-parent",
        # A new session keeps the workload away from the gateway's controlling terminal (TIOCSTI).
        "--new-session",
        # bwrap run by root keeps every capability unless told otherwise.
        "--cap-drop",
        "ALL",
    ]
    if layout.info_fd is not None:
        argv += ["--info-fd", str(layout.info_fd)]
    for entry in layout.entries:
        if entry.name in _REPLACED:
            continue
        target = f"/{entry.name}"
        if entry.symlink_target is not None:
            argv += ["--symlink", entry.symlink_target, target]
        else:
            argv += ["--ro-bind", str(layout.root / entry.name), target]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    for source, target in layout.extra_ro_binds:
        argv += ["--ro-bind", str(source), target]
    for path in layout.hidden:
        argv += ["--tmpfs", str(path)]
    argv += ["--bind", str(layout.workspace_dir), WORKSPACE]
    argv += ["--bind", str(layout.supervisor_socket), GATEWAY_SOCKET]
    argv += ["--remount-ro", "/"]
    argv += ["--hostname", layout.hostname, "--chdir", WORKSPACE, "--clearenv"]
    for key, value in layout.environment.items():
        argv += ["--setenv", key, value]
    argv += ["--", *layout.command]
    return argv


def supervisor_environment(
    *,
    instance_id: str,
    bootstrap_fd: int,
    gateway_url: str,
    home: str,
    pythonpath: str = "",
) -> dict[str, str]:
    """The supervisor's whole environment: nothing from the host, nothing from the request."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": home,
        "WARMSHELL_GATEWAY": gateway_url,
        "WARMSHELL_BOOTSTRAP_FD": str(bootstrap_fd),
        "WARMSHELL_INSTANCE_ID": instance_id,
    }
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env
