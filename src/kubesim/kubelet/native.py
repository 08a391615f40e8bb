"""The fork server's container set-up in C (``containersetup.c`` beside this file): compiled on
first use into kubesim's cache directory (once per version of the source and choice of compilers),
loaded with ctypes and called in each forked container instead of the same steps in Python; an
exec'd container is spawned as the program built beside it (``kubesim-container``).

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

__all__ = [
    "SOURCE",
    "ContainerSetup",
    "SetupError",
    "build",
    "cache_dir",
    "load",
    "mount_words",
    "start_words",
    "top_words",
]

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
    directory = directory or cache_dir()
    cc = shlex.split(os.environ.get("CC", "")) or ["cc"]
    # The program starts once per exec'd container: static against musl (when its compiler is
    # there and no $CC is asked for) it starts ~0.5 ms of CPU cheaper than linked to glibc.
    musl = shutil.which("musl-gcc") if "CC" not in os.environ else None
    program_cc = [musl, "-static"] if musl is not None else cc
    # One build per version of the source and choice of compilers.
    version = hashlib.sha256(SOURCE.read_bytes() + repr((cc, program_cc)).encode()).hexdigest()[:16]
    library, program = directory / f"containersetup-{version}.so", directory / f"kubesim-container-{version}"
    for target, compiler, flags in (
        (library, cc, ["-shared", "-fPIC"]),
        (program, program_cc, ["-DKUBESIM_CONTAINER_MAIN"]),
    ):
        if target.exists():
            continue
        if shutil.which(compiler[0]) is None:
            raise FileNotFoundError(f"no C compiler ({compiler[0]}) for {SOURCE.name}")
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            command = [compiler[0], *_FLAGS, *compiler[1:], *flags, "-o", str(partial), str(SOURCE)]
            subprocess.run(command, check=True, capture_output=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return library, program


def load(directory: pathlib.Path | None = None) -> ContainerSetup:
    """The C set-up, compiled first if needed (``build``'s errors, or OSError if it cannot load)."""
    library, program = build(directory)
    return ContainerSetup(ctypes.CDLL(str(library), use_errno=True), program)


def mount_words(spec: Mapping[str, Any], spec_path: pathlib.Path) -> list[str]:
    """The C set-up's words (``containersetup.c``) for a container's mount ``spec`` (the view
    ``kubesim.kubelet.mountns`` reads from ``spec_path``)."""
    out = []
    if spec.get("netns"):
        out += ["netns", spec["netns"]]
    out += ["scratch", str(spec.get("scratch") or spec_path.parent)]
    for bind in spec.get("binds") or []:
        out += ["bind", bind["source"], bind["target"], "1" if bind.get("readOnly") else "0"]
    if spec.get("hosts"):
        out += ["hosts", spec["hosts"]]
    if private := spec.get("private"):
        out += ["private", private["root"], private["pod"]]
    for path in spec.get("hide") or []:
        out += ["hide", str(path)]
    return out


def start_words(*, log: str, cwd: str, mounts: Sequence[str], pid_namespace: bool) -> str:
    """One container start's words, packed (NUL-separated): its output, directory and mounts,
    and a ``/proc`` of its own when it has a PID namespace of its own."""
    return "\0".join(["log", log, "cwd", cwd, *mounts, *(["proc"] if pid_namespace else [])])


def top_words(points: Sequence[str]) -> str:
    """The host's top-level mount points as the C set-up's words, packed."""
    return "\0".join(word for point in points for word in ("top", point))


class ContainerSetup:
    """The loaded library and the program built beside it."""

    def __init__(self, library: ctypes.CDLL, program: pathlib.Path) -> None:
        self.program = str(program)
        self._packed = library.kubesim_container_packed
        self._packed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        self._packed.restype = ctypes.c_int
        self._error = library.kubesim_error
        self._error.restype = ctypes.c_char_p

    def run(self, words: str, top: bytes) -> None:
        """Set the calling (forked) process up as the container ``words`` and the host's ``top``
        (both packed, see ``start_words`` and ``top_words``) describe; SetupError when a step
        fails."""
        packed = os.fsencode(words)
        if self._packed(packed, len(packed), top, len(top)) != 0:
            raise SetupError(os.fsdecode(self._error() or b"the container set-up failed"))

    def spawn(self, words: str, top: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
        """Start an exec'd container: ``kubesim-container`` spawned (no fork of the caller's pages,
        no Python in the child), set up as ``words`` and ``top`` say, then ``argv`` exec'd; its pid."""
        setup = [word for packed in (words, top) if packed for word in packed.split("\0")]
        return os.posix_spawn(self.program, [self.program, str(len(setup)), *setup, *argv], env)
