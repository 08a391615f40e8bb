"""A fork server that starts the containers of pods the kubelet gives their own mount namespace (as
root): a container start is a fork of a small waiting process instead of a Python start of the
mount namespace launcher (``kubesim.kubelet.mountns``), and no launcher stays beside the container.

Two kinds of start, one server process per distinct ``preload`` (started by the kubelet on first
use):

- **exec** (the server with no ``preload``): any container's argv. The server spawns
  ``kubesim-container`` (``kubesim.kubelet.native``: no copy of the server's pages, no Python in
  the child), which sets the container up (below) and execs the argv, as
  ``kubesim.kubelet.mountns`` would have.
- **module** (a server with ``preload``): a container of an image whose rule names ``preload``
  modules, when its argv is ``<this python> -m MODULE ARGS...``. The server imports the modules
  once (the pods share them copy-on-write); the child runs MODULE as ``__main__`` as ``runpy`` would,
  so a container start costs no Python start at all.

For each start the server starts the container's process in a PID namespace of its own (unless
the pod sets ``shareProcessNamespace``), where it is PID 1 (as in a container, or bwrap
``--unshare-pid --as-pid-1``: a signal from outside reaches it only if it handles it, SIGKILL
always; when it exits, everything it started dies), and the child does what the launcher would,
in C (``containersetup.c``; in Python where no C compiler could build it):
1. a new session (the kubelet signals the container's process group), stdin ``/dev/null``, stdout
   and stderr appended to the container log, the container's working directory;
2. the container's mount namespace, exactly as ``kubesim.kubelet.mountns`` makes it (volumes at
   their ``mountPath``, the pod's ``/etc/hosts``, the pod's network namespace), and a ``/proc``
   of its PID namespace;
3. the container's environment, then the exec or MODULE.

The server reports each start's pid and, when the container exits, its status (128+N when
killed by signal N) back to the kubelet (JSON lines on its stdout). If the server goes, every
container it started goes with it (parent-death signal), and the kubelet sees them exit with 137;
if the kubelet goes first, the server kills each container's process group before it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import traceback
import types
from typing import Any

# mountns and netns: imported once here, shared by every container's mount setup.
from kubesim.kubelet import containers, mountns, native, netns, rehearsal  # noqa: F401

__all__ = ["ForkServer", "forkable"]

CLONE_NEWPID = 0x20000000
KILLED_WITH_SERVER = 128 + signal.SIGKILL


def forkable(argv: list[str], preload: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """``(MODULE, ARGS)`` when ``argv`` runs ``-m MODULE`` with this interpreter and MODULE is, or
    is a package above, one of ``preload``; otherwise None (the container is exec'd)."""
    if not preload or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return None
    module = argv[2]
    if not any(name == module or name.startswith(module + ".") for name in preload):
        return None
    return module, argv[3:]


# -- the kubelet's side ----------------------------------------------------------------------------
class ForkServer:
    """The kubelet's handle on one fork server process."""

    def __init__(self, preload: tuple[str, ...], *, env: dict[str, str]) -> None:
        self.preload = preload
        self._env = env
        self._process: containers.PipedProcess | None = None
        self._reader: asyncio.Task[None] | None = None
        self._next_id = 0
        self._starting: dict[int, asyncio.Future[containers.ReportedProcess]] = {}
        self._running: dict[int, containers.ReportedProcess] = {}
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def _ensure(self) -> asyncio.subprocess.Process:
        async with self._lock:
            if self._process is None or self._process.returncode is not None:
                if self._process is not None:
                    self._process.close()  # a server that died: its pipes too
                self._process = await containers.start_piped(
                    [sys.executable, "-m", "kubesim.kubelet.forkserver", *self.preload],
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=self._env,
                    start_new_session=True,
                )
                self._reader = asyncio.create_task(self._read(self._process.process), name="kubesim-forkserver")
            return self._process.process

    async def spawn(
        self,
        module: str,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: pathlib.Path,
        log_path: pathlib.Path,
        mounts: pathlib.Path,
        mount_words: list[str],
        pid_namespace: bool = True,
    ) -> containers.ReportedProcess:
        """Start ``python -m module args`` as a container (see the module doc); OSError if the
        server cannot fork. ``mounts`` is its mount spec (``kubesim.kubelet.mountns``), and
        ``mount_words`` the same for the C set-up (``native.mount_words``). Without
        ``pid_namespace`` (a pod sharing its process namespace) it runs in the server's."""
        start = {"module": module, "args": args}
        return await self._start(start, env, cwd, log_path, (mounts, mount_words), pid_namespace)

    async def spawn_exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: pathlib.Path,
        log_path: pathlib.Path,
        mounts: pathlib.Path,
        mount_words: list[str],
        pid_namespace: bool = True,
    ) -> containers.ReportedProcess:
        """Start ``argv`` as a container (the exec kind, see the module doc); as ``spawn``."""
        start = {"argv": argv}
        return await self._start(start, env, cwd, log_path, (mounts, mount_words), pid_namespace)

    async def _start(
        self,
        start: dict[str, Any],
        env: dict[str, str],
        cwd: pathlib.Path,
        log_path: pathlib.Path,
        mounts: tuple[pathlib.Path, list[str]],
        pid_namespace: bool,
    ) -> containers.ReportedProcess:
        process = await self._ensure()
        assert process.stdin is not None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._next_id += 1
        ident = self._next_id
        started: asyncio.Future[containers.ReportedProcess] = asyncio.get_running_loop().create_future()
        self._starting[ident] = started
        request = {
            "id": ident,
            **start,
            "env": env,
            "cwd": str(cwd),
            "log": str(log_path),
            "mounts": str(mounts[0]),
            "pidns": pid_namespace,
            # The C set-up's words, made here: in the server, every object made between two forks
            # costs it copies of the pages it touches (~0.5 ms per start to read the spec there).
            "setup": native.start_words(log=str(log_path), cwd=str(cwd), mounts=mounts[1], pid_namespace=pid_namespace),
        }
        process.stdin.write(json.dumps(request).encode() + b"\n")
        try:
            await process.stdin.drain()
            return await asyncio.shield(started)  # a cancelled start still hears its report
        except asyncio.CancelledError:
            # The pod was stopped meanwhile (its start cancelled): the server starts the
            # container all the same, and nobody would stop it. Killed once it is reported.
            started.add_done_callback(_kill_abandoned)
            raise
        finally:
            if started.done():  # else kept for its report (`_read` drops it then)
                self._starting.pop(ident, None)

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        try:
            async for line in process.stdout:
                message = json.loads(line)
                ident = message["id"]
                if "pid" in message:
                    self._running[ident] = containers.ReportedProcess(message["pid"])
                    if (waiting := self._starting.pop(ident, None)) is not None and not waiting.done():
                        waiting.set_result(self._running[ident])
                elif "error" in message:
                    if (waiting := self._starting.pop(ident, None)) is not None and not waiting.done():
                        waiting.set_exception(OSError(f"fork server: {message['error']}"))
                elif "exit" in message and (forked := self._running.pop(ident, None)) is not None:
                    forked.exited(int(message["exit"]))
        finally:
            # The server is gone, and every container with it (parent-death signals).
            for forked in self._running.values():
                forked.exited(KILLED_WITH_SERVER)
            self._running.clear()
            for waiting in self._starting.values():
                if not waiting.done():
                    waiting.set_exception(OSError("the fork server exited"))

    async def aclose(self) -> None:
        """Stop the server (its containers die with it) and wait for it."""
        server, self._process = self._process, None
        if server is None:
            return
        server.close()  # closes its pipes and kills it if it still runs
        await server.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


def _kill_abandoned(started: asyncio.Future[containers.ReportedProcess]) -> None:
    """SIGKILL a container whose start was abandoned, once reported (the server reaps it and
    reports its exit as for any other)."""
    if not started.cancelled() and started.exception() is None:
        containers.signal_group(started.result(), signal.SIGKILL)


# -- the server ------------------------------------------------------------------------------------
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _status_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _main_code(module: str) -> tuple[importlib.machinery.ModuleSpec, Any]:
    """What ``python -m module`` runs: its spec (a package's ``__main__``) and code object. Found
    once by the server: in a forked child the search and the unmarshal cost ~0.8 ms of CPU, most
    of it copies of the pages they touch, per container."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{module}.__main__")
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
        raise ImportError(f"no code to run for {module!r}")
    return spec, spec.loader.get_code(spec.name)


def _run_main(spec: importlib.machinery.ModuleSpec, code: Any) -> None:
    """Run ``code`` as ``__main__``, as ``runpy.run_module(..., alter_sys=True)`` does."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=spec.origin,
        __cached__=spec.cached,
        __loader__=spec.loader,
        __package__=spec.parent,
        __spec__=spec,
    )
    sys.modules["__main__"] = main
    sys.argv[0] = spec.origin or sys.argv[0]
    exec(code, main.__dict__)


def _container(
    request: dict[str, Any], libc: Any, setup: native.ContainerSetup | None, top: str, main: tuple[Any, Any] | None
) -> None:
    """The forked child, PID 1 of its own PID namespace: session, output, mounts, its own /proc,
    its environment, then the exec or MODULE (with ``setup``, all but MODULE's run in C).
    Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if setup is not None:
            setup.run(request["setup"], os.fsencode(top))
        else:
            _python_setup(request, libc)
    except BaseException as exc:  # reported in the container log, like mountns
        print(f"kubesim: cannot start the container: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
    if "argv" in request:
        _exec(request["argv"], request["env"])
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-m", *request["args"]]
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        try:
            _run_main(*(main or _main_code(request["module"])))
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
    except BaseException:  # whatever the container raised ends it, as a crash would
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _python_setup(request: dict[str, Any], libc: Any) -> None:
    """The container's set-up in Python, where the C one (``kubesim.kubelet.native``) could not be
    built: what ``containersetup.c`` does, step for step."""
    os.setsid()
    mountns.die_with_parent(libc)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    mountns.enter(pathlib.Path(request["mounts"]))
    if request.get("pidns", True):
        mountns.mount_proc(libc)


def _native_setup() -> native.ContainerSetup | None:
    """The C set-up, built on first use; None (said on stderr) where it cannot be."""
    try:
        return native.load()
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.decode(errors="replace") if isinstance(exc, subprocess.CalledProcessError) else ""
        print(f"kubesim fork server: containers set up in Python: {exc} {detail}", file=sys.stderr, flush=True)
        return None


def _start(
    request: dict[str, Any],
    libc: Any,
    setup: native.ContainerSetup | None,
    top: str,
    mains: dict[str, tuple[importlib.machinery.ModuleSpec, Any]],
) -> int:
    """Start one container (its pid): an exec'd one spawned as ``kubesim-container`` and a
    MODULE forked, both set up in C (``top``: the host's top-level mount points, packed); without
    the C set-up, forked and set up in Python. ``mains``: each MODULE's code, found once."""
    if setup is not None and "argv" in request:
        return setup.spawn(request["setup"], top, request["argv"], request["env"])
    main = None
    if (module := request.get("module")) is not None and (main := mains.get(module)) is None:
        with contextlib.suppress(Exception):  # the child finds it again and reports why not
            main = mains[module] = _main_code(module)
    pid = os.fork()
    if pid == 0:
        _container(request, libc, setup, top, main)
    return pid


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """The exec kind's last step, where it is set up in Python. Never returns."""
    # What this interpreter changed that an exec keeps: a container starts with the defaults.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"kubesim: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)


class _PidNamespaces:
    """Each fork gets a fresh PID namespace: ``unshare(CLONE_NEWPID)`` only sets the namespace of
    the caller's next children (once per namespace), so the server returns to its own first."""

    def __init__(self, libc: Any) -> None:
        self._libc = libc
        self._home = os.open("/proc/self/ns/pid", os.O_RDONLY)

    def next_child_in_new_namespace(self) -> None:
        self.next_child_in_own_namespace()
        if self._libc.unshare(CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), f"a new PID namespace: {os.strerror(ctypes.get_errno())}")

    def next_child_in_own_namespace(self) -> None:
        """The server's own (a pod sharing its process namespace), not the last container's."""
        if self._libc.setns(self._home, CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), f"the server's PID namespace: {os.strerror(ctypes.get_errno())}")


def _send(message: dict[str, Any]) -> None:
    os.write(1, json.dumps(message).encode() + b"\n")


def serve(preload: list[str]) -> int:
    """Import ``preload``, then fork a container per request on stdin until stdin closes."""
    for name in preload:
        importlib.import_module(name)
    rehearsal.rehearse()
    # The imported heap stays untouched by the collector, so the children share its pages.
    gc.collect()
    gc.freeze()
    libc = _libc()
    setup = _native_setup()
    namespaces = _PidNamespaces(libc)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, int] = {}  # container pid -> request id
    last_points: list[str] | None = None
    top = ""
    mains: dict[str, tuple[importlib.machinery.ModuleSpec, Any]] = {}
    pending = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_read], [], [])
        except InterruptedError:
            continue
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if (ident := children.pop(pid, None)) is not None:
                    _send({"id": ident, "exit": _status_code(status)})
        if 0 in readable:
            data = os.read(0, 1 << 16)
            if not data:
                # The kubelet is gone: the containers follow, their own children too (a container
                # sharing its pod's process namespace is no PID 1 whose death would take them),
                # and a child not yet in its own group (before its setsid) itself.
                for pid in children:
                    for kill in (os.killpg, os.kill):
                        with contextlib.suppress(OSError):
                            kill(pid, signal.SIGKILL)
                return 0
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                try:
                    if (points := mountns.refresh_host_mounts()) is not last_points:
                        last_points, top = points, native.top_words(points)
                    if request.get("pidns", True):
                        namespaces.next_child_in_new_namespace()
                    else:
                        namespaces.next_child_in_own_namespace()
                    pid = _start(request, libc, setup, top, mains)
                except OSError as exc:
                    _send({"id": request["id"], "error": str(exc)})
                    continue
                children[pid] = request["id"]
                _send({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
