"""The fork server's container set-up in C (``containersetup.c`` beside this file): compiled on
first use into kubesim's cache directory (one library per version of the source), loaded with
ctypes, and called in each forked container instead of the same steps in Python.

The set-up is what ``kubesim.kubelet.forkserver`` and ``kubesim.kubelet.mountns`` do for a container
(session, output, working directory, network namespace, mount namespace, ``/proc``, exec); in the
Python the server forked it cost ~3.5 ms of CPU per container, most of it copy-on-write faults of
the interpreter's pages, against ~0.9 ms of system calls. Without a C compiler (``$CC`` or ``cc``)
the fork server keeps the Python set-up and says so once on its stderr.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SOURCE", "ContainerSetup", "PreparedSetup", "build", "cache_dir", "load", "words"]

SOURCE = pathlib.Path(__file__).with_name("containersetup.c")
_FLAGS = ("-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror")


class SetupError(OSError):
    """A step of the C set-up failed (the message names it)."""


def cache_dir() -> pathlib.Path:
    """``$KUBESIM_CACHE``, else ``$XDG_CACHE_HOME/kubesim``, else ``~/.cache/kubesim``."""
    if explicit := os.environ.get("KUBESIM_CACHE"):
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "kubesim"


def build(directory: pathlib.Path | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """The library and the ``kubesim-container`` program for this version of the source, compiled
    now if they are not there yet (each written whole: two servers compiling at once each replace
    it with a complete one). FileNotFoundError without a C compiler, CalledProcessError when the
    compile fails."""
    source = SOURCE.read_bytes()
    directory = directory or cache_dir()
    version = hashlib.sha256(source).hexdigest()[:16]
    library, program = directory / f"containersetup-{version}.so", directory / f"kubesim-container-{version}"
    cc = shlex.split(os.environ.get("CC", "")) or ["cc"]
    for target, flags in ((library, ["-shared", "-fPIC"]), (program, ["-DKUBESIM_CONTAINER_MAIN"])):
        if target.exists():
            continue
        if shutil.which(cc[0]) is None:
            raise FileNotFoundError(f"no C compiler ({cc[0]}) for {SOURCE.name}")
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            subprocess.run([*cc, *_FLAGS, *flags, "-o", str(partial), str(SOURCE)], check=True, capture_output=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return library, program


def load(directory: pathlib.Path | None = None) -> ContainerSetup:
    """The C set-up, compiled first if needed (``build``'s errors, or OSError if it cannot load)."""
    library, program = build(directory)
    return ContainerSetup(ctypes.CDLL(str(library), use_errno=True), program)


def words(
    request: Mapping[str, Any], spec: Mapping[str, Any], spec_path: pathlib.Path, top: Sequence[str]
) -> list[str]:
    """The C set-up's words (``containersetup.c``) for a fork server's start ``request`` and the
    container's mount ``spec`` (``kubesim.kubelet.mountns``); ``top`` the host's top-level mount
    points (shortest first)."""
    out = ["log", request["log"], "cwd", request["cwd"]]
    if spec.get("netns"):
        out += ["netns", spec["netns"]]
    out += ["scratch", str(spec.get("scratch") or spec_path.parent)]
    for bind in spec.get("binds") or []:
        out += ["bind", bind["source"], bind["target"], "1" if bind.get("readOnly") else "0"]
    if spec.get("hosts"):
        out += ["hosts", spec["hosts"]]
    for point in top:
        out += ["top", point]
    if private := spec.get("private"):
        out += ["private", private["root"], private["pod"]]
    for path in spec.get("hide") or []:
        out += ["hide", str(path)]
    if request.get("pidns", True):
        out.append("proc")
    return out


def _strings(items: Sequence[str]) -> Any:
    array = (ctypes.c_char_p * (len(items) + 1))()
    array[:-1] = [os.fsencode(item) for item in items]
    return array


class PreparedSetup:
    """One forked container's set-up as a C array, made in the fork server before it forks (the
    child then builds no Python object for it)."""

    def __init__(self, setup: ContainerSetup, words: Sequence[str]) -> None:
        self._setup = setup
        self._count = len(words)
        self._words = _strings(words)

    def run(self) -> None:
        """Set the calling (forked) process up as the container; SetupError when a step fails."""
        self._setup.call(self._count, self._words)


class ContainerSetup:
    """The loaded library."""

    def __init__(self, library: ctypes.CDLL, program: pathlib.Path) -> None:
        self.program = str(program)
        self._container = library.kubesim_container
        self._container.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._container.restype = ctypes.c_int
        self._error = library.kubesim_error
        self._error.restype = ctypes.c_char_p

    def prepare(self, words: Sequence[str]) -> PreparedSetup:
        """``words`` ready for a forked child's ``run``."""
        return PreparedSetup(self, words)

    def spawn(self, words: Sequence[str], argv: Sequence[str], env: Mapping[str, str]) -> int:
        """Start an exec'd container: ``kubesim-container`` spawned (no fork of the caller's pages,
        no Python in the child), set up as ``words`` say, then ``argv`` exec'd; its pid."""
        return os.posix_spawn(self.program, [self.program, str(len(words)), *words, *argv], env)

    def call(self, count: int, words: Any) -> None:
        """``kubesim_container`` with no program: the set-up alone (see ``PreparedSetup.run``)."""
        if self._container(count, words, None, None) != 0:
            raise SetupError(os.fsdecode(self._error() or b"the container set-up failed"))
