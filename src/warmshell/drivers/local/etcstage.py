"""The /etc of sandboxes on the host's root: the allow-listed files copied into one directory,
bound at /etc with one mount.

Binding each allowed /etc file on its own cost bwrap a bind, a read-only remount and a scan of
the (growing) mount table per file: about half of the CPU of a sandbox start (`bench/burst.py`).
A copy of the files, checked before every start and refreshed when a source changed (its inode,
size or mtime), gives the same view for one bind. The allowed directories (`ssl`,
`alternatives`, ...) stay binds of their own, over empty mount points in the copy. A copy keeps
its source's permission bits (and, for a gateway run as root, its owner), so a sandbox can read
in the copy exactly what it could read through a bind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["EtcStage"]

_Signature = tuple[int, int, int, int]


class EtcStage:
    """One staged /etc directory and what each of its copies was made from."""

    def __init__(self, directory: Path, source: Path, allowed: Sequence[str]) -> None:
        """`allowed` names the entries of `source` (the host's /etc) to stage; `directory` holds
        the copies (made 0755, owned by the gateway's uid). Nothing is read before `refresh`."""
        self.directory = directory
        self._source = source
        self._allowed = frozenset(allowed)
        self._names: tuple[str, ...] = ()
        self._copied: dict[str, _Signature] = {}
        self._lock = threading.Lock()
        self.subdirectories: tuple[str, ...] = ()

    def refresh(self) -> None:
        """Blocking, and safe from several threads at once: bring every copy up to date with its
        source (cheap when nothing changed: one stat per name)."""
        with self._lock:
            if not self._copied and not self.subdirectories:
                self._create()
            for name in self._names:
                if name in self.subdirectories:
                    continue
                try:
                    info = os.stat(self._source / name)
                except OSError:
                    if self._copied.pop(name, None) is not None:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.directory / name)
                    continue
                signature = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
                if self._copied.get(name) != signature and stat.S_ISREG(info.st_mode):
                    self._copy(name, info)
                    self._copied[name] = signature

    def remove(self) -> None:
        """Blocking: remove the directory (the gateway stops; its sandboxes have ended)."""
        with self._lock:
            shutil.rmtree(self.directory, ignore_errors=True)
            self._copied.clear()
            self.subdirectories = ()

    def _create(self) -> None:
        """A fresh directory (whatever a previous gateway left is removed) with a mount point for
        every allowed subdirectory."""
        self._names = tuple(sorted(set(os.listdir(self._source)) & self._allowed))
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(mode=0o755, parents=True)
        os.chmod(self.directory, 0o755)
        found = [n for n in self._names if (self._source / n).is_dir()]
        for name in found:
            (self.directory / name).mkdir(mode=0o755)
        self.subdirectories = tuple(found)

    def _copy(self, name: str, info: os.stat_result) -> None:
        partial = self.directory / f".{name}.partial"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        shutil.copyfile(self._source / name, partial)
        os.chmod(partial, stat.S_IMODE(info.st_mode) & 0o777)
        os.utime(partial, ns=(info.st_atime_ns, info.st_mtime_ns))
        if os.geteuid() == 0:
            os.chown(partial, info.st_uid, info.st_gid)
        os.replace(partial, self.directory / name)  # a sandbox starting now sees old or new, whole
