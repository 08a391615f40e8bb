"""Container-runtime shim for kubesim pods running the warmshell image (test-only).

kubesim's kubelet runs a container as a host process and exposes each volume mount at
``$KUBESIM_POD_ROOT/<mountPath>``. A real container sees its mounts at ``<mountPath>`` itself, so
this shim does what a runtime would: it finds the mounts under the pod root and starts
``python -m warmshell <args>`` in a bubblewrap mount namespace where the host's tree is visible and
each mount appears at its real path (``/var/run/secrets/warmshell/token``, ``/workspace``). The
supervisor runs unchanged.

As in a container, the supervisor is PID 1 of its own PID namespace: when it dies, everything it
started dies with it, so a restarted container starts from a clean process table.

Usage (kubesim image map): ``{"programs": {"warmshell": [sys.executable, __file__]}}``; the pod's
``args`` (``["supervisor"]``) follow. With ``--agent`` first (the image's ``warmshell-agent``,
``{"warmshell-agent": [sys.executable, __file__, "--agent"]}``) it runs the built agent instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def mounts(pod_root: Path) -> dict[str, Path]:
    """Container path -> host directory, from the kubelet's symlinks under the pod root."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, _ in os.walk(pod_root):
        for name in list(dirnames):
            path = Path(dirpath) / name
            if name.startswith(".") and Path(dirpath) == pod_root:
                dirnames.remove(name)
            elif path.is_symlink():
                found["/" + str(path.relative_to(pod_root))] = path.resolve()
                dirnames.remove(name)
    return found


def _host(path: str) -> str:
    """The host location of a container path (``/var/run`` is a symlink to ``/run`` on hosts)."""
    parent, _, leaf = path.rpartition("/")
    return os.path.join(os.path.realpath(parent or "/"), leaf)


def plan(directory: str, targets: list[str]) -> list[str]:
    """bwrap arguments reproducing ``directory`` from the host, with room made for ``targets``."""
    args: list[str] = []
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        inner = [t for t in targets if t == path or t.startswith(path + "/")]
        if path in ("/proc", "/dev"):
            continue
        if inner and os.path.isdir(path) and not os.path.islink(path) and path not in inner:
            args += ["--dir", path, *plan(path, inner)]
        elif not inner or path not in inner:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            else:
                args += ["--dev-bind", path, path]
    return args


def main() -> None:
    pod_root = Path(os.environ["KUBESIM_POD_ROOT"])
    found = {_host(target): source for target, source in mounts(pod_root).items()}
    args = ["bwrap", "--die-with-parent", "--unshare-pid", "--as-pid-1"]
    args += ["--tmpfs", "/", *plan("/", sorted(found))]
    args += ["--proc", "/proc", "--dev-bind", "/dev", "/dev"]
    for target, source in sorted(found.items()):
        args += ["--bind", str(source), target]
    if sys.argv[1:2] == ["--agent"]:
        from warmshell.drivers.local.runtime.agent.installing import BUILT_AGENT

        command = [str(BUILT_AGENT), *sys.argv[2:]]
    else:
        command = [sys.executable, "-m", "warmshell", *sys.argv[1:]]
    os.execvp("bwrap", [*args, "--", *command])


if __name__ == "__main__":
    main()
