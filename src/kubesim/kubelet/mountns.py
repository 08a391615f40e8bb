"""A container's filesystem view: run a command in its own mount namespace, with every volume
bind-mounted at its real ``mountPath`` and the pod's hosts file at ``/etc/hosts``.

``python -m kubesim.kubelet.mountns SPEC -- ARGV...`` is what the kubelet starts (as root; without
the privilege it runs containers in the host's view, volumes under ``$KUBESIM_POD_ROOT`` only).
SPEC is a JSON file ``{"binds": [{"source", "target", "readOnly"}], "hosts": path, "netns": path,
"private": {"root": path, "pod": path}, "hide": [path], "pidns": bool}`` (``netns``: join the
pod's network namespace first, see ``kubesim.kubelet.netns``). ``private`` covers the kubelet's
root with an empty tmpfs but for the container's own pod directory, and ``hide`` covers the pod's
volumes this container does not mount: a container sees no other pod's files and no volume it
does not mount (a token mounted into one container only is unreadable from the others). Each
container gets a devpts instance of its own on ``/dev/pts``, as from a container runtime.
``pidns``: the command runs as PID 1 of a PID namespace of its own, with its own ``/proc`` (as a
container does unless the pod sets ``shareProcessNamespace``); this launcher stays as its parent
(the kubelet's signals to the process group reach both) and exits with its status (128+N when
killed by signal N), and its death kills the container (parent-death signal). Mount points
that do not exist on the host (``/etc/warmshell``) are made inside a throw-away overlay of their
nearest existing parent, so the host's filesystem is never changed. Then the command is exec'd:
a process inside opens ``/var/run/secrets/kubernetes.io/serviceaccount/token`` like in a real pod.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import select
import signal
import stat
import sys
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


class MountError(Exception):
    """A mount the container needs could not be made."""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _c(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if libc.mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data)) != 0:
        errno = ctypes.get_errno()
        raise MountError(f"mount {source!r} on {target!r} ({fstype or 'bind'}): {os.strerror(errno)}")


def existing_parent(target: Path) -> Path:
    """The deepest existing ancestor of ``target`` (symlinks resolved), itself if it exists."""
    current = target
    while not current.exists():
        current = current.parent
    return current.resolve()


def overlay_roots(targets: list[Path]) -> list[Path]:
    """The directories to overlay so that every missing mount point can be created: for each
    target that does not exist, its nearest existing parent (``/`` for ``/workspace``)."""
    roots: list[Path] = []
    for target in targets:
        if target.exists():
            continue
        parent = existing_parent(target)
        if not any(parent == r or r in parent.parents for r in roots):
            roots = [r for r in roots if parent not in r.parents] + [parent]
    return roots


_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
MNT_DETACH = 2


def _pivot_root(libc: Any, new_root: Path) -> None:
    """Make ``new_root`` (a mount point) the root, the old one at ``/.kubesim-old-root``; keep the cwd."""
    cwd = os.getcwd()
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise MountError(f"pivot_root: unknown syscall number on {platform.machine()}")
    old = new_root / ".kubesim-old-root"
    old.mkdir(exist_ok=True)
    os.chdir(new_root)
    if libc.syscall(number, b".", b".kubesim-old-root") != 0:
        raise MountError(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    os.chdir(cwd)


def _drop_old_root(libc: Any) -> None:
    # Only once every bind is made: a mount cannot be bound from a detached tree.
    if libc.umount2(b"/.kubesim-old-root", MNT_DETACH) != 0:
        raise MountError(f"umount the old root: {os.strerror(ctypes.get_errno())}")
    os.rmdir("/.kubesim-old-root")


def _top_level_mounts() -> list[str]:
    """Mount points whose parent is the root mount (from /proc/self/mountinfo), shortest first."""
    rows = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    root_ids = {r[0] for r in rows if r[4] == "/"}
    points = {r[4].encode().decode("unicode_escape") for r in rows if r[1] in root_ids and r[4] != "/"}
    return sorted(points, key=lambda p: (len(Path(p).parts), p))


class HostMounts:
    """The host's top-level mount points, read again only when its mount table has changed.

    A fork server asks before every fork, so each container inherits the answer instead of
    parsing the table itself: ~0.8 ms of each container's start, most of it copy-on-write faults
    of the forked server's pages, and three containers per sandbox pod. The kernel marks a
    ``/proc/self/mountinfo`` descriptor ``POLLPRI`` at every change of the namespace's mounts."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI | select.POLLERR)
        self._points: list[str] | None = None

    def points(self) -> list[str]:
        """The current top-level mount points (see ``_top_level_mounts``)."""
        if self._points is None or self._poll.poll(0):
            self._points = _top_level_mounts()
        return self._points


# Set by a fork server (``refresh_host_mounts``) before each fork; None in the launcher.
_host_mounts: HostMounts | None = None
_host_points: list[str] | None = None


def refresh_host_mounts() -> list[str]:
    """Read the host's top-level mount points now if they changed (in the fork server, before a
    fork: the container's setup then uses them as they are); returns them."""
    global _host_mounts, _host_points
    if _host_mounts is None:
        _host_mounts = HostMounts()
    _host_points = _host_mounts.points()
    return _host_points


def setup(spec: dict[str, Any], scratch: Path) -> None:
    """Enter a new mount namespace and make the mounts ``spec`` asks for."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        raise MountError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, None)
    binds = [b for b in spec.get("binds") or [] if Path(b["source"]).exists()]
    hosts = spec.get("hosts")
    targets = [Path(b["target"]) for b in binds]
    roots = overlay_roots(targets)
    # Hold every source open first: a mount over /tmp (or /) must not hide the sources below it.
    ordered = sorted(binds, key=lambda b: len(Path(b["target"]).parts))  # parents before children
    handles = [os.open(b["source"], os.O_PATH) for b in ordered]
    hosts_fd = os.open(hosts, os.O_PATH) if hosts else None
    submounts = (_host_points if _host_points is not None else _top_level_mounts()) if Path("/") in roots else []
    held = [(point, os.open(point, os.O_PATH)) for point in submounts]
    for i, root in enumerate(roots):
        layer = scratch / f"overlay-{i}"
        layer.mkdir(parents=True, exist_ok=True)
        _mount(libc, "tmpfs", str(layer), "tmpfs", 0, "mode=0755")
        for sub in ("upper", "work", "root"):
            (layer / sub).mkdir()
        options = f"lowerdir={root},upperdir={layer / 'upper'},workdir={layer / 'work'}"
        if root != Path("/"):
            _mount(libc, "overlay", str(root), "overlay", 0, options)
            continue
        # A mount on / itself is never walked into: build the overlay aside, give it /proc and
        # every other mount that hung off the root (/dev, /sys…, from the handles held above),
        # then make it the process's root (pivot_root, not chroot: a bwrap inside must pivot too).
        new_root = layer / "root"
        _mount(libc, "overlay", str(new_root), "overlay", 0, options)
        # Top-level directories no new mount point goes into are the host's own (bound, not
        # overlaid: a Unix socket is not reachable through an overlay), submounts included.
        creating = {
            existing_parent(t).parts[1] for t in targets if not t.exists() and len(existing_parent(t).parts) > 1
        }
        real = [
            f"/{entry}"
            for entry in sorted(os.listdir("/"))
            if entry not in creating
            and entry != "proc"
            and os.path.isdir(f"/{entry}")
            and not os.path.islink(f"/{entry}")
        ]
        for path in real:
            _mount(libc, path, str(new_root / path.lstrip("/")), None, MS_BIND | MS_REC, None)
        for point, fd in held:
            if point != "/proc" and not any(point == r or point.startswith(r + "/") for r in real):
                _mount(libc, f"/proc/self/fd/{fd}", str(new_root / point.lstrip("/")), None, MS_BIND | MS_REC, None)
        _mount(libc, "proc", str(new_root / "proc"), "proc", 0, None)
        _pivot_root(libc, new_root)
    for bind, fd in zip(ordered, handles, strict=True):
        target = Path(bind["target"])
        if target.is_symlink():
            # The host-view symlink ``volumes.mount`` left inside a parent volume: the mount replaces it.
            target.unlink()
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", str(target), None, MS_BIND | MS_REC, None)
    # Read-only last (children first), so mount points inside a read-only mount could be made.
    for bind in reversed(ordered):
        if bind.get("readOnly"):
            _mount(libc, None, bind["target"], None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    if hosts_fd is not None and Path("/etc/hosts").exists():
        _mount(libc, f"/proc/self/fd/{hosts_fd}", "/etc/hosts", None, MS_BIND, None)
    for fd in [*handles, *(fd for _, fd in held), *([hosts_fd] if hosts_fd is not None else [])]:
        os.close(fd)
    if Path("/") in roots:
        _drop_old_root(libc)
    _own_devpts(libc)
    _cover(libc, spec.get("private"), [str(path) for path in spec.get("hide") or []])


def _own_devpts(libc: Any) -> None:
    """A devpts instance of the container's own on ``/dev/pts``, as a container runtime mounts
    one (runc: ``newinstance,ptmxmode=0666,mode=0620``): a terminal opened in one container is no
    device of another's, and ``/dev/ptmx`` (which opens the ``pts`` beside it) opens this one."""
    if Path("/dev/pts").is_dir():
        _mount(libc, "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")


def _cover(libc: Any, private: dict[str, str] | None, hide: list[str]) -> None:
    """An empty tmpfs over the kubelet's root but for this pod's directory, then over each volume
    of the pod this container does not mount (the binds above were made from the real ones)."""
    cwd = os.getcwd()
    if private:
        pod = os.open(private["pod"], os.O_PATH)
        _mount(libc, "tmpfs", private["root"], "tmpfs", 0, "mode=0755")
        Path(private["pod"]).mkdir(parents=True, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{pod}", private["pod"], None, MS_BIND | MS_REC, None)
        os.close(pod)
    for path in hide:
        if Path(path).is_dir():
            _mount(libc, "tmpfs", path, "tmpfs", MS_RDONLY, "mode=0755")
    # The working directory as the container sees it (the old one may now be covered).
    with contextlib.suppress(OSError):
        os.chdir(cwd)


def mount_proc(libc: Any) -> None:
    """A ``/proc`` of the caller's PID namespace (in its own mount namespace)."""
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        raise MountError(f"mount /proc: {os.strerror(ctypes.get_errno())}")


def die_with_parent(libc: Any) -> None:
    """SIGKILL when the parent goes (the runtime that holds a container)."""
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


# What the kubelet sends to stop a container: its PID 1 gets them itself (the kubelet signals the
# launcher's process group, the container's too), this launcher only waits for its end.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _fork_pid_namespace(libc: Any) -> int:
    """Fork a child that is PID 1 of a new PID namespace (in the launcher's process group, dead
    with the launcher); 0 in the child, its pid in the parent."""
    if libc.unshare(CLONE_NEWPID) != 0:
        raise MountError(f"unshare(CLONE_NEWPID): {os.strerror(ctypes.get_errno())}")
    # The launcher's liveness as the child can see it (its parent is outside its namespace: its
    # getppid() is 0): the write end closes when the launcher dies.
    alive, holding = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(holding)
        die_with_parent(libc)
        if select.select([alive], [], [], 0)[0]:  # EOF: the launcher died before the line above
            os._exit(137)
        os.close(alive)
        return 0
    os.close(alive)
    return pid


def _hold(pid: int) -> int:
    """The launcher's life once its container started: wait for it, return its status."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _hold_netns() -> int:
    """``mountns --hold-netns``: own a new network namespace (the pod's "pause") until killed or
    until its stdin, a pipe from the kubelet, closes: a kubelet killed without its clean-up
    (SIGKILL, OOM) takes its pods' namespaces with it."""
    from kubesim.kubelet import netns

    try:
        netns.unshare_net()
    except OSError as exc:
        print(f"kubesim: cannot create the pod's network namespace: {exc}", file=sys.stderr, flush=True)
        return 127
    print("ready", flush=True)
    while os.read(0, 4096):
        pass
    return 0


def enter(spec_path: Path) -> None:
    """Join the spec's network namespace (if any) and make its mount namespace; raises
    MountError or OSError."""
    spec = json.loads(spec_path.read_text())
    enter_spec(spec, spec_path)


def enter_spec(spec: dict[str, Any], spec_path: Path) -> None:
    """``enter`` for a spec already read."""
    if spec.get("netns"):
        from kubesim.kubelet import netns

        netns.enter(spec["netns"])
    setup(spec, Path(spec.get("scratch") or spec_path.parent))


def main(argv: list[str]) -> int:
    """``mountns SPEC -- ARGV...``: set up, then exec ARGV (exit 127 when a mount fails)."""
    if argv == ["--hold-netns"]:
        return _hold_netns()
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m kubesim.kubelet.mountns SPEC -- COMMAND...", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(argv[0]).read_text())
        if spec.get("pidns"):
            libc = _libc()
            pid = _fork_pid_namespace(libc)
            if pid:
                return _hold(pid)
        enter_spec(spec, Path(argv[0]))
        if spec.get("pidns"):
            mount_proc(libc)
    except (MountError, OSError) as exc:
        print(f"kubesim: cannot set up the container's mounts: {exc}", file=sys.stderr, flush=True)
        return 127
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as exc:
        print(f"kubesim: cannot run {argv[2]!r}: {exc}", file=sys.stderr, flush=True)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
