"""A removal walk for a pod's directory, measured against `shutil.rmtree` (not adopted: the
kubelet keeps rmtree; see this folder's README, fifth pass).

A pod directory holds a dozen entries (volumes, mount symlinks, the token, the hosts file, logs,
mount specs), and one goes with every pod the kubelet stops: one per warm claim. `shutil.rmtree`
guards against symlink races with an `lstat`, an `fstat` and a same-file check per directory;
opening each directory with `O_NOFOLLOW` relative to its parent's descriptor gives the same
guarantee (a container that swaps a directory for a symlink makes the open fail, nothing outside
is touched) and takes the directory-entry type from `scandir` without a `stat`. On tmpfs that was
0.16 ms of CPU per pod against rmtree's 0.21 (300 pods shaped like a warm pool member's).
"""

from __future__ import annotations

import contextlib
import os
import pathlib

__all__ = ["remove"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove(path: pathlib.Path) -> None:
    """Remove the directory ``path`` and everything below it, never following a symlink; what
    cannot be removed is left (as ``shutil.rmtree(path, ignore_errors=True)``)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return
    try:
        _clear(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _clear(fd: int) -> None:
    """Remove every entry of the open directory ``fd``, best effort."""
    try:
        with os.scandir(fd) as entries:
            listed = [(entry.name, _is_dir(entry)) for entry in entries]
    except OSError:
        return
    for name, is_dir in listed:
        try:
            if is_dir:
                _remove_subdir(fd, name)
            else:
                os.unlink(name, dir_fd=fd)
        except OSError:
            continue


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _remove_subdir(parent: int, name: str) -> None:
    sub = os.open(name, _DIR_FLAGS, dir_fd=parent)  # ELOOP if it became a symlink: left alone
    try:
        _clear(sub)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=parent)
