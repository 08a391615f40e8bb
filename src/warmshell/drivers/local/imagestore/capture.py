"""A layer captured from a live directory tree (a sandbox's copy-on-write upper layer, its
`/workspace`), written through the same path as an imported layer.

The trees are written as a tar stream in one thread and unpacked from it in the caller's
(`extracting.extract_layer`, the importer's own writer), so what a sandbox wrote passes the same
rules as any archive from outside (`entries`: no setuid bit, no device node, no path out of the
layer, no write through a link) and the layer's digest is that of its tar, as for an import. Only
what the trees hold is read: a snapshot costs time in what the sandbox changed, not in its image.

An upper layer speaks overlayfs's language and is translated into a layer's: a 0/0 character
device (how overlayfs records a deletion in its upper layer) becomes a `.wh.NAME` whiteout, and a
directory marked `user.overlay.opaque=y` (made again after a deletion) gets the opaque marker.
A directory overlayfs redirected (`user.overlay.redirect`, a renamed lower directory) has content
the upper layer does not hold: it is refused, as the sandboxes' overlays are mounted without
`redirect_dir` and should never make one. A plain tree (`/workspace`, a tmpfs of the sandbox) is
taken as it is, its root opaque (the sandbox saw nothing of the image's `/workspace` under it).

The trees are read through descriptors opened without following links, from a sandbox that is
frozen while this runs; a file replaced by a link meanwhile is not followed (`O_NOFOLLOW`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from warmshell.core.errors import FailedPreconditionError
from warmshell.drivers.local.imagestore import entries
from warmshell.drivers.local.imagestore.extracting import OPAQUE_XATTR, BoundedReader, Limits, extract_layer
from warmshell.drivers.local.imagestore.records import LayerRecord
from warmshell.drivers.local.imagestore.store import SIZE_KEY

__all__ = ["REDIRECT_XATTR", "Tree", "capture_layer", "is_whiteout", "tree_bytes"]

REDIRECT_XATTR = "user.overlay.redirect"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Tree:
    """One tree to capture: a directory descriptor (borrowed), where its content goes in the
    layer (`prefix`, "" for the layer's root), and whether it is an overlayfs upper layer."""

    fd: int
    prefix: str = ""
    upper: bool = False


def is_whiteout(info: os.stat_result) -> bool:
    """Whether an upper layer's entry is overlayfs's record of a deletion (a 0/0 char device)."""
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _xattr(fd: int, key: str) -> bytes | None:
    try:
        return os.getxattr(fd, key)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise


def _walk(fd: int, parts: tuple[str, ...]) -> Iterator[tuple[int, tuple[str, ...], str, os.stat_result]]:
    """(directory fd, its path, name, lstat) of every entry below `fd`, parents first."""
    for name in sorted(os.listdir(fd)):
        info = os.lstat(name, dir_fd=fd)
        yield fd, parts, name, info
        if stat.S_ISDIR(info.st_mode):
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                yield from _walk(child, (*parts, name))
            finally:
                os.close(child)


def tree_bytes(trees: list[Tree]) -> int:
    """The bytes the trees' regular files hold, as a tar would carry them (their apparent size:
    a sparse file is stored whole): what a capture will ask of the store."""
    total = 0
    for tree in trees:
        for _, _, _, info in _walk(tree.fd, ()):
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


class _TarWriter:
    """Writes the trees' tar stream into a pipe (run in a thread)."""

    def __init__(self, trees: list[Tree], out: BinaryIO) -> None:
        self._trees = trees
        self._out = out
        self._links: dict[tuple[int, int], str] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with tarfile.open(fileobj=self._out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for tree in self._trees:
                    self._tree(tar, tree)
        except BaseException as exc:  # handed to the reading side, which raises it
            self.error = exc
        finally:
            with contextlib.suppress(OSError):  # the reader gave up first
                self._out.close()

    def _tree(self, tar: tarfile.TarFile, tree: Tree) -> None:
        prefix = tuple(p for p in tree.prefix.split("/") if p)
        if prefix:
            tar.addfile(_info("/".join(prefix), tarfile.DIRTYPE, os.fstat(tree.fd)))
            if not tree.upper:
                tar.addfile(_info("/".join((*prefix, entries.OPAQUE_MARKER)), tarfile.REGTYPE, None))
        if tree.upper:
            self._marks(tar, tree.fd, prefix)
        for parent, parts, name, info in _walk(tree.fd, ()):
            self._entry(tar, tree, parent, (*prefix, *parts, name), info)

    def _marks(self, tar: tarfile.TarFile, fd: int, path: tuple[str, ...]) -> None:
        """An upper directory's overlayfs markers, as a layer's entries."""
        if _xattr(fd, REDIRECT_XATTR) is not None:
            raise FailedPreconditionError(
                f"/{'/'.join(path)} is a renamed directory of the image (an overlayfs redirect), "
                "which a snapshot cannot capture"
            )
        if _xattr(fd, OPAQUE_XATTR) == b"y":
            tar.addfile(_info("/".join((*path, entries.OPAQUE_MARKER)), tarfile.REGTYPE, None))

    def _entry(
        self, tar: tarfile.TarFile, tree: Tree, parent: int, path: tuple[str, ...], info: os.stat_result
    ) -> None:
        name = "/".join(path)
        if stat.S_ISDIR(info.st_mode):
            tar.addfile(_info(name, tarfile.DIRTYPE, info))
            if tree.upper:
                fd = os.open(path[-1], _DIR_FLAGS, dir_fd=parent)
                try:
                    self._marks(tar, fd, path)
                finally:
                    os.close(fd)
        elif stat.S_ISLNK(info.st_mode):
            link = _info(name, tarfile.SYMTYPE, info)
            link.linkname = os.readlink(path[-1], dir_fd=parent)
            tar.addfile(link)
        elif tree.upper and is_whiteout(info):
            tar.addfile(_info("/".join((*path[:-1], entries.WHITEOUT_PREFIX + path[-1])), tarfile.REGTYPE, None))
        elif stat.S_ISREG(info.st_mode):
            self._file(tar, parent, path, info)
        # Devices, FIFOs and sockets are not carried: a layer never stores them (`entries`).

    def _file(self, tar: tarfile.TarFile, parent: int, path: tuple[str, ...], info: os.stat_result) -> None:
        name = "/".join(path)
        key = (info.st_dev, info.st_ino)
        if info.st_nlink > 1 and key in self._links:
            link = _info(name, tarfile.LNKTYPE, info)
            link.linkname = self._links[key]
            tar.addfile(link)
            return
        fd = os.open(path[-1], _FILE_FLAGS, dir_fd=parent)
        with os.fdopen(fd, "rb") as handle:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                return
            member = _info(name, tarfile.REGTYPE, opened)
            member.size = opened.st_size
            tar.addfile(member, _Exactly(handle, opened.st_size))
        if info.st_nlink > 1:
            self._links[key] = name


class _Exactly:
    """A file read to the size its header states: a file that grew meanwhile is cut, one that
    shrank is padded with zeros, so the stream always matches its headers."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self._handle = handle
        self._left = size

    def read(self, n: int = -1) -> bytes:
        want = self._left if n < 0 else min(n, self._left)
        data = self._handle.read(want)[:want]
        if len(data) < want and want > 0:
            data += b"\0" * (want - len(data))
        self._left -= len(data)
        return data


def _info(name: str, kind: bytes, info: os.stat_result | None) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.mode = stat.S_IMODE(info.st_mode) if info is not None else 0o644
    member.mtime = int(info.st_mtime) if info is not None else 0
    member.uid = member.gid = 0  # the store owns what it holds; an image's User says who runs it
    return member


class _Hashing:
    """The tar stream read from the pipe, hashed (the layer's digest)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.sha = hashlib.sha256()

    def read(self, n: int = -1, /) -> bytes:
        data = self._raw.read(n)
        self.sha.update(data)
        return data


def capture_layer(trees: list[Tree], dest: Path, *, budget: int, where: str, max_entries: int) -> LayerRecord:
    """Write `trees` as one layer into `dest` (a new directory under the store's staging/),
    refusing past `budget` bytes of tar (RESOURCE_EXHAUSTED naming the store's bound)."""
    read_end, write_end = os.pipe()
    reader, writer_file = os.fdopen(read_end, "rb"), os.fdopen(write_end, "wb")
    writer = _TarWriter(trees, writer_file)
    thread = threading.Thread(target=writer.run, name="warmshell-capture", daemon=True)
    thread.start()
    hashed = _Hashing(reader)
    bounded = BoundedReader(hashed, limit=budget, key=SIZE_KEY, where=where)
    try:
        stats = extract_layer(bounded, dest, where=where, limits=Limits(budget=budget, max_entries=max_entries))
    except BaseException:
        _stop(reader, thread)
        # A stream cut short by the writer's own failure reads as a bad tar: say why it stopped.
        if writer.error is not None and not isinstance(writer.error, BrokenPipeError):
            raise writer.error from None
        raise
    _stop(reader, thread)
    if writer.error is not None:
        raise writer.error
    return LayerRecord(
        digest="sha256:" + hashed.sha.hexdigest(),
        size=bounded.count,
        entries=stats.entries,
        files=stats.files,
        whiteouts=tuple(stats.whiteouts),
        opaque=tuple(stats.opaque),
    )


def _stop(reader: BinaryIO, thread: threading.Thread) -> None:
    reader.close()  # a writer still writing gets EPIPE and ends
    thread.join()
