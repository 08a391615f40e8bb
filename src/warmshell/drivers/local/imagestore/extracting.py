"""Unpacking one layer's tar stream into a directory that overlayfs can use as a lower layer.

Every entry goes through `entries.decide`; what is written is written relative to directory
descriptors opened without following symbolic links (`O_NOFOLLOW`), so an entry can never be
written through a link an earlier entry planted (`a -> /etc`, then `a/passwd`): such an entry
refuses the layer. Files are created with `O_EXCL` after any earlier entry at the same path is
removed, so the last entry of a path wins as tar's own semantics say.

Whiteouts become overlayfs's extended-attribute whiteouts (kernel 6.7 and later, read with the
`userxattr` mount option inside the sandbox's user namespace): an empty file carrying
`user.overlay.whiteout`, its directory marked `user.overlay.opaque=x` ("holds whiteouts"); an
opaque directory is marked `user.overlay.opaque=y`. Overlayfs's other form, a 0/0 character
device, needs CAP_MKNOD in the host's namespace, which a gateway run by a normal user lacks;
flattening the layers into one tree instead would cost a full copy per image and lose the
sharing of layers between images. Each layer's whiteouts are also listed in its record.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore import entries
from warmshell.drivers.local.imagestore.entries import Kind
from warmshell.drivers.local.imagestore.sources import Readable, ReadableInto
from warmshell.drivers.local.imagestore.tarreading import TarReader

__all__ = [
    "OPAQUE_XATTR",
    "WHITEOUT_XATTR",
    "BoundedReader",
    "FileData",
    "LayerStats",
    "LayerTree",
    "Limits",
    "apply_action",
    "extract_layer",
]

WHITEOUT_XATTR = "user.overlay.whiteout"
OPAQUE_XATTR = "user.overlay.opaque"
_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Read once (an enum member read through its class costs ~160 ns on Python 3.11).
_FILE, _SYMLINK, _HARDLINK = Kind.FILE, Kind.SYMLINK, Kind.HARDLINK


@dataclass(frozen=True)
class Limits:
    """Bounds of one layer: its uncompressed tar bytes (`budget`, what the store may still take)
    and its entries."""

    budget: int
    max_entries: int = 1_000_000
    store_key: str = "local.image_store_size"


@dataclass
class LayerStats:
    """What a layer held once unpacked."""

    entries: int = 0
    files: int = 0
    file_bytes: int = 0
    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    skipped: int = 0


class BoundedReader:
    """The uncompressed tar stream, counted: past `limit` bytes the import is refused, so a small
    compressed blob cannot expand without bound (a gzip bomb, or millions of tiny entries).

    The tar reader has it fill one buffer of its own, again and again: a new `bytes` per
    megabyte, faulted in page by page, cost more system time than writing the layer's files.
    A stream that can only `read` (a pipe of `capture`) is copied into that buffer."""

    def __init__(self, raw: Readable | ReadableInto, *, limit: int, key: str, where: str) -> None:
        self._raw = raw
        self._into = raw.readinto if isinstance(raw, ReadableInto) else None
        self.limit = limit
        self.key = key
        self.where = where
        self.count = 0

    def readinto(self, buffer: memoryview, /) -> int:
        """Fill up to `len(buffer)` bytes of `buffer`; how many (0 at the end)."""
        try:
            if self._into is not None:
                n = self._into(buffer)
            else:
                data = self._raw.read(len(buffer))
                n = len(data)
                buffer[:n] = data
        except (EOFError, zlib.error, OSError) as exc:
            raise InvalidArgumentError(self.where, f"is truncated or corrupt ({exc})") from None
        self._count(n)
        return n

    def _count(self, n: int) -> None:
        self.count += n
        if self.count > self.limit:
            raise ResourceExhaustedError(
                f"{self.where}: unpacks to more than the {self.limit} bytes left under {self.key}"
            )

    def drain(self) -> None:
        """Read what follows the tar's end (padding, a compressor's trailer) so hashes complete."""
        buffer = memoryview(bytearray(_CHUNK))
        while self.readinto(buffer):
            pass


class FileData(Protocol):
    """Where the data of the entry being written comes from (the tar reader's current entry, or
    a live file a snapshot captures)."""

    def copy_to(self, fd: int) -> None:
        """Write the entry's data (all of it, as its header states) to `fd`."""
        ...


class LayerTree:
    """Descriptors on the layer's directories, reached without following a symbolic link and
    kept while the tar's entries stay in one place: a Debian root is ~9,000 entries a few
    directories deep, and opening every parent again for each entry was most of an import's
    time. Dropped whenever a directory is removed (a later entry replacing it), so a kept
    descriptor never names a directory that is no longer in the tree."""

    _MOST = 256

    def __init__(self, root: int, where: str) -> None:
        self.root = root
        self.where = where
        self._open: dict[tuple[str, ...], int] = {}
        # The directory asked for last: the next entry is most often in it, and comparing the
        # path costs less than hashing it (its names are new strings, their hashes not cached).
        self._last: tuple[tuple[str, ...], int] = ((), root)

    def directory(self, path: tuple[str, ...]) -> int:
        """A descriptor (borrowed: the tree closes it) on `path`, made (0755) where missing."""
        last_path, last_fd = self._last
        if path == last_path:
            return last_fd
        if not path:
            return self.root
        known = self._open.get(path)
        if known is not None:
            self._last = (path, known)
            return known
        parent = self.directory(path[:-1])
        try:
            fd = os.open(path[-1], _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            os.mkdir(path[-1], 0o755, dir_fd=parent)
            fd = os.open(path[-1], _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise InvalidArgumentError(
                self.where, f"entry under {'/'.join(path)!r} passes through a symbolic link or a file"
            ) from None
        self._open[path] = fd
        self._last = (path, fd)
        return fd

    def trim(self) -> None:
        """Between entries (never while one holds borrowed descriptors): keep at most a few hundred."""
        if len(self._open) > self._MOST:
            self.forget()

    def forget(self, under: tuple[str, ...] = ()) -> None:
        """Close the kept descriptors of `under` and what is below it (all by default)."""
        self._last = ((), self.root)
        for path in [p for p in self._open if p[: len(under)] == under]:
            os.close(self._open.pop(path))


def extract_layer(stream: BoundedReader, dest: Path, *, where: str, limits: Limits) -> LayerStats:
    """Unpack the tar read from `stream` into the (new, empty) directory `dest`."""
    stats = LayerStats()
    dest.mkdir(mode=0o755)
    tree = LayerTree(os.open(dest, _DIR_FLAGS), where)
    try:
        with TarReader(stream, where=where) as tar:
            for number, entry in enumerate(tar, 1):
                if number > limits.max_entries:
                    raise InvalidArgumentError(where, f"has more than {limits.max_entries} entries")
                action = entries.decide(entry, where=where, max_entry_bytes=limits.budget)
                apply_action(action, tar, entry, tree, stats)
                tree.trim()
                stats.entries = number
        stream.drain()
    finally:
        tree.forget()
        os.close(tree.root)
    return stats


def apply_action(
    action: entries.Action, data: FileData, entry: entries.Entry, tree: LayerTree, stats: LayerStats
) -> None:
    """Carry out what `entries.decide` made of `entry` in the layer `tree` (a file's data from `data`)."""
    if type(action) is entries.Write:  # the first test, and exact: nearly every entry is one
        if action.kind is _FILE:
            _write_file(action, data, tree, stats)
        elif action.kind is _HARDLINK:
            _link(action, entry, tree)
        else:
            _write(action, tree)
    elif isinstance(action, entries.Skip):
        stats.skipped += 1
    elif isinstance(action, entries.Opaque):
        _set_opaque(tree.directory(action.directory), b"y")
        stats.opaque.append("/".join(action.directory) or ".")
    elif isinstance(action, entries.Whiteout):
        _whiteout(tree.directory(action.parent), action.name)
        stats.whiteouts.append("/".join((*action.parent, action.name)))


def _write_file(action: entries.Write, data: FileData, tree: LayerTree, stats: LayerStats) -> None:
    parent = tree.directory(action.path[:-1])
    name = action.path[-1]
    try:  # almost every entry is the only one at its path: trying first spares a `stat` each
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=parent)
    except FileExistsError:
        _clear(tree, action.path, keep_directory=False)
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=parent)
    try:
        if action.size:
            data.copy_to(fd)
            stats.file_bytes += action.size
        os.fchmod(fd, action.mode)
    finally:
        os.close(fd)
    stats.files += 1


def _link(action: entries.Write, entry: entries.Entry, tree: LayerTree) -> None:
    def link() -> None:
        src, dst = tree.directory(action.link_path[:-1]), tree.directory(action.path[:-1])
        os.link(action.link_path[-1], action.path[-1], src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)

    try:
        _replacing(tree, action.path, link)
    except OSError as exc:  # missing, or a directory (EPERM): no file of this layer to share
        raise InvalidArgumentError(
            tree.where,
            f"entry {entry.name!r} is a hard link to {entry.link!r}, not a file of the layer ({exc.strerror})",
        ) from None


def _write(action: entries.Write, tree: LayerTree) -> None:
    """A symbolic link or a directory."""
    parent = tree.directory(action.path[:-1])
    name = action.path[-1]
    if action.kind is _SYMLINK:
        _replacing(tree, action.path, lambda: os.symlink(action.link, name, dir_fd=parent))
        return
    was_whiteout = False
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        was_whiteout = _clear(tree, action.path, keep_directory=True)
        if not _exists(parent, name):
            os.mkdir(name, 0o700, dir_fd=parent)
    fd = tree.directory(action.path)
    os.fchmod(fd, action.mode)
    if was_whiteout:  # deleted below, then made again here: nothing of the old one shows
        _set_opaque(fd, b"y")


def _replacing(tree: LayerTree, path: tuple[str, ...], make: Callable[[], None]) -> None:
    """`make()`, which creates `path` and fails if something is there; when an earlier entry
    left something, that is removed and `make()` called again. Trying first spares a `stat` per
    entry, and almost every entry of a layer is the only one at its path."""
    try:
        make()
    except FileExistsError:
        _clear(tree, path, keep_directory=False)
        make()


def _exists(parent: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    return True


def _clear(tree: LayerTree, path: tuple[str, ...], *, keep_directory: bool) -> bool:
    """Remove what an earlier entry left at `path` (a directory stays when one replaces it);
    whether it was a whiteout."""
    parent, name = tree.directory(path[:-1]), path[-1]
    try:
        info = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(info.st_mode):
        if not keep_directory:
            tree.forget(under=path)
            shutil.rmtree(name, dir_fd=parent)
        return False
    was_whiteout = stat.S_ISREG(info.st_mode) and _is_whiteout(parent, name)  # a link is never one
    os.unlink(name, dir_fd=parent)
    return was_whiteout


def _is_whiteout(parent: int, name: str) -> bool:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
    try:
        os.getxattr(fd, WHITEOUT_XATTR)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _whiteout(parent: int, name: str) -> None:
    try:
        info = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        info = None
    if info is not None:
        # The layer itself has `name` (the whiteout deleted the lower one first): a directory
        # of this layer must then not merge with the deleted one; a file hides it already.
        if stat.S_ISDIR(info.st_mode):
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            try:
                _set_opaque(fd, b"y")
            finally:
                os.close(fd)
        return
    fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=parent)
    try:
        _setxattr(fd, WHITEOUT_XATTR, b"")
    finally:
        os.close(fd)
    try:
        current = os.getxattr(parent, OPAQUE_XATTR)
    except OSError:
        current = b""
    if current != b"y":
        _setxattr(parent, OPAQUE_XATTR, b"x")


def _set_opaque(fd: int, value: bytes) -> None:
    _setxattr(fd, OPAQUE_XATTR, value)


def _setxattr(fd: int, key: str, value: bytes) -> None:
    try:
        os.setxattr(fd, key, value)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise FailedPreconditionError(
                "the image store's filesystem does not keep user.* extended attributes, which "
                "overlayfs whiteouts need: put local.image_dir on ext4, xfs, btrfs or tmpfs"
            ) from None
        raise
