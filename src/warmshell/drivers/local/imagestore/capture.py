"""A layer captured from a live directory tree (a sandbox's copy-on-write upper layer, its
`/workspace`), written through the importer's own entry rules.

Each entry the trees hold is stated as the tar entry an archive of them would carry, decided by
`entries.decide` and written by `extracting.apply_action`, exactly as an imported layer's: what a
sandbox wrote passes the same rules as any archive from outside (no setuid bit, no device node,
no path out of the layer, no write through a link). Only the tar itself is never made: a file's
data goes from the tree to the layer in the kernel (`copy_file_range`, which reflinks where the
filesystem can; else `splice` through a kernel pipe, or `sendfile`), never through a tar, its
parser and Python's buffers, which cost ~400 ms of CPU per 200 MB against ~50 ms this way. Only
what the trees hold is read: a snapshot costs time in what the sandbox changed, not in its image.

How the layer is named (`content`):
- a tagged snapshot is content-addressed as an imported layer is: its digest is the sha256 of
  the tar an archive of the trees is (PAX headers as Python's `tarfile` writes them, the data,
  the padding), hashed in the same pass that copies the data (read, hash, write: ~215 ms of CPU
  per 200 MB, the hash ~110 ms of it), so two equal layers are stored once;
- an untagged snapshot (a fork's or a pause's, which no one names but by the image digest it is
  given) is named by a random sha256 and its record says so (`by_content` False): no full read
  for a hash on the fork's critical path, at the price that an unchanged sandbox forked twice
  stores its layer twice. An import can never claim such a layer: it checks every layer's tar
  against its diff id, even one the store holds.
Either way `size` is the bytes of that tar, what the layer counts against the store's bound.

An upper layer speaks overlayfs's language and is translated into a layer's: a 0/0 character
device (how overlayfs records a deletion in its upper layer) becomes a `.wh.NAME` whiteout, and a
directory marked `user.overlay.opaque=y` (made again after a deletion) gets the opaque marker.
A directory overlayfs redirected (`user.overlay.redirect`, a renamed lower directory) has content
the upper layer does not hold: it is refused, as the sandboxes' overlays are mounted without
`redirect_dir` and should never make one. A plain tree (`/workspace`, a tmpfs of the sandbox) is
taken as it is, its root opaque (the sandbox saw nothing of the image's `/workspace` under it).

The trees are read through descriptors opened without following links, from a sandbox that is
frozen while this runs; a file replaced by a link meanwhile is not followed (`O_NOFOLLOW`). A file
is copied to the size it had when opened: one that grew meanwhile is cut, one that shrank is
padded with zeros, so the layer always matches its stated entries.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore import entries
from warmshell.drivers.local.imagestore.entries import Kind
from warmshell.drivers.local.imagestore.extracting import OPAQUE_XATTR, LayerStats, LayerTree, apply_action
from warmshell.drivers.local.imagestore.records import LayerRecord
from warmshell.drivers.local.imagestore.store import SIZE_KEY

__all__ = ["REDIRECT_XATTR", "Tree", "capture_layer", "is_whiteout", "tree_bytes"]

REDIRECT_XATTR = "user.overlay.redirect"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CHUNK = 1 << 20
_PREALLOCATE = 1 << 20
# The largest pipe any user may ask for (/proc/sys/fs/pipe-max-size's default): see `_copy_across`.
_PIPE_BYTES = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
_KINDS = {tarfile.DIRTYPE: Kind.DIRECTORY, tarfile.SYMTYPE: Kind.SYMLINK, tarfile.LNKTYPE: Kind.HARDLINK}
# What the kernel answers when it cannot copy between these two files itself (another
# filesystem, or one without copy_file_range): then splice or sendfile, which always can.
_NO_RANGE_COPY = (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)


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


class _TarBytes:
    """The tar an archive of the trees would be, counted against `budget` (RESOURCE_EXHAUSTED
    past it, as an import's stream is) and hashed when the layer is named by its content."""

    def __init__(self, *, content: bool, budget: int, where: str) -> None:
        self.sha = hashlib.sha256() if content else None
        self.count = 0
        self._budget = budget
        self._where = where

    def add(self, data: bytes | memoryview) -> None:
        """Bytes of the tar, in order."""
        if self.sha is not None:
            self.sha.update(data)
        self.count += len(data)

    def check(self, more: int) -> None:
        """Refuse before `more` bytes would pass the budget (nothing of them is written)."""
        if self.count + more > self._budget:
            raise ResourceExhaustedError(
                f"{self._where}: unpacks to more than the {self._budget} bytes left under {SIZE_KEY}"
            )

    def zeros(self, n: int) -> None:
        """`n` NUL bytes (padding), hashed without a buffer of that size."""
        if self.sha is None:
            self.count += max(n, 0)
            return
        while n > 0:
            step = min(n, _CHUNK)
            self.add(bytes(step))
            n -= step

    def end(self) -> None:
        """Two zero blocks, then zeros to a whole record, as `tarfile` closes a stream."""
        self.zeros(2 * _BLOCK)
        self.zeros(-self.count % tarfile.RECORDSIZE)

    def digest(self) -> str:
        """The layer's digest: the tar's, or a random one when it is not named by its content."""
        if self.sha is not None:
            return "sha256:" + self.sha.hexdigest()
        return "sha256:" + hashlib.sha256(b"warmshell untagged snapshot layer\0" + os.urandom(32)).hexdigest()


class _LiveFile:
    """A regular file of a tree as the data of its entry: `size` bytes (the size it had when
    opened), copied in the kernel, or read, hashed and written in one pass when the layer is
    named by its content."""

    def __init__(self, fd: int, size: int, tar: _TarBytes) -> None:
        self._fd = fd
        self._size = size
        self._tar = tar
        self.copied = False

    def copy_to(self, fd: int) -> None:
        """Write the file's data to `fd` (see `extracting.FileData`)."""
        self.copied = True
        if self._tar.sha is None:
            if self._size >= _PREALLOCATE:
                # The blocks at once rather than one delayed allocation per page written:
                # ~15 ms less CPU per 200 MB copied from tmpfs to ext4.
                os.posix_fallocate(fd, 0, self._size)
            done = _copy_in_kernel(self._fd, fd, self._size)
            self._tar.count += done
        else:
            done = self._copy_hashing(fd)
        if done < self._size:  # it shrank meanwhile: zeros to the stated size
            os.ftruncate(fd, self._size)
            self._tar.zeros(self._size - done)

    def skip(self) -> None:
        """The entry wrote no data (a file named as a whiteout): its bytes are still the tar's."""
        if self._tar.sha is None:
            self._tar.count += self._size
        else:
            self._copy_hashing(None)

    def _copy_hashing(self, fd: int | None) -> int:
        buffer = bytearray(min(_CHUNK, max(self._size, 1)))
        view, done = memoryview(buffer), 0
        while done < self._size:
            got = os.readv(self._fd, [view[: min(len(buffer), self._size - done)]])
            if not got:
                break
            self._tar.add(view[:got])
            written = 0
            while fd is not None and written < got:
                written += os.write(fd, view[written:got])
            done += got
        if fd is None:
            self._tar.zeros(self._size - done)
        return done


def _copy_in_kernel(source: int, target: int, size: int) -> int:
    """Copy up to `size` bytes from the start of `source` to `target` (at its offset) without
    them entering this process; the bytes copied (fewer when the file is shorter now)."""
    done = 0
    while done < size:
        try:
            got = os.copy_file_range(source, target, size - done, done)
        except OSError as exc:
            if exc.errno not in _NO_RANGE_COPY:
                raise
            return done + _copy_across(source, target, done, size - done)
        if not got:
            break
        done += got
    return done


def _copy_across(source: int, target: int, offset: int, count: int) -> int:
    """Copy up to `count` bytes of `source` from `offset` to `target` (at its offset) where the
    kernel cannot copy between the two files itself (another filesystem); the bytes copied.

    A large file goes through a pipe of `_PIPE_BYTES` by `splice`: the source's pages are
    referenced into the pipe, not copied, and written out 1 MiB a call where `sendfile`'s own
    pipe moves 64 KiB: ~14% less CPU per 200 MB from a sandbox's tmpfs into the store on ext4."""
    if count < _PIPE_BYTES:
        return _send(source, target, offset, count)
    pipe_out, pipe_in = os.pipe2(os.O_CLOEXEC)
    try:
        # Past the user's quota of pipe pages the kernel refuses a larger pipe: its default then.
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        done = 0
        while done < count:
            got = os.splice(source, pipe_in, min(count - done, _PIPE_BYTES), offset_src=offset + done)
            if not got:
                break
            written = 0
            while written < got:
                written += os.splice(pipe_out, target, got - written)
            done += got
        return done
    finally:
        os.close(pipe_out)
        os.close(pipe_in)


def _send(source: int, target: int, offset: int, count: int) -> int:
    done = 0
    while done < count and (got := os.sendfile(target, source, offset + done, count - done)):
        done += got
    return done


class _Capture:
    """Writes the trees' entries into the layer at `tree`, in the order a tar of them has."""

    def __init__(self, tree: LayerTree, tar: _TarBytes, *, budget: int, max_entries: int) -> None:
        self._tree = tree
        self._tar = tar
        self._budget = budget
        self._max_entries = max_entries
        self._links: dict[tuple[int, int], str] = {}
        self.stats = LayerStats()

    def run(self, trees: list[Tree]) -> None:
        for tree in trees:
            self._one(tree)
        self._tar.end()

    def _one(self, tree: Tree) -> None:
        prefix = tuple(p for p in tree.prefix.split("/") if p)
        if prefix:
            self._emit(_info("/".join(prefix), tarfile.DIRTYPE, os.fstat(tree.fd)))
            if not tree.upper:
                self._emit(_info("/".join((*prefix, entries.OPAQUE_MARKER)), tarfile.REGTYPE, None))
        if tree.upper:
            self._marks(tree.fd, prefix)
        for parent, parts, name, info in _walk(tree.fd, ()):
            self._entry(tree, parent, (*prefix, *parts, name), info)

    def _marks(self, fd: int, path: tuple[str, ...]) -> None:
        """An upper directory's overlayfs markers, as a layer's entries."""
        if _xattr(fd, REDIRECT_XATTR) is not None:
            raise FailedPreconditionError(
                f"/{'/'.join(path)} is a renamed directory of the image (an overlayfs redirect), "
                "which a snapshot cannot capture"
            )
        if _xattr(fd, OPAQUE_XATTR) == b"y":
            self._emit(_info("/".join((*path, entries.OPAQUE_MARKER)), tarfile.REGTYPE, None))

    def _entry(self, tree: Tree, parent: int, path: tuple[str, ...], info: os.stat_result) -> None:
        name = "/".join(path)
        if stat.S_ISDIR(info.st_mode):
            self._emit(_info(name, tarfile.DIRTYPE, info))
            if tree.upper:
                fd = os.open(path[-1], _DIR_FLAGS, dir_fd=parent)
                try:
                    self._marks(fd, path)
                finally:
                    os.close(fd)
        elif stat.S_ISLNK(info.st_mode):
            link = _info(name, tarfile.SYMTYPE, info)
            link.linkname = os.readlink(path[-1], dir_fd=parent)
            self._emit(link)
        elif tree.upper and is_whiteout(info):
            self._emit(_info("/".join((*path[:-1], entries.WHITEOUT_PREFIX + path[-1])), tarfile.REGTYPE, None))
        elif stat.S_ISREG(info.st_mode):
            self._file(parent, path, info)
        # Devices, FIFOs and sockets are not carried: a layer never stores them (`entries`).

    def _file(self, parent: int, path: tuple[str, ...], info: os.stat_result) -> None:
        name = "/".join(path)
        key = (info.st_dev, info.st_ino)
        if info.st_nlink > 1 and key in self._links:
            link = _info(name, tarfile.LNKTYPE, info)
            link.linkname = self._links[key]
            self._emit(link)
            return
        fd = os.open(path[-1], _FILE_FLAGS, dir_fd=parent)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                return
            member = _info(name, tarfile.REGTYPE, opened)
            member.size = opened.st_size
            self._emit(member, _LiveFile(fd, opened.st_size, self._tar))
        finally:
            os.close(fd)
        if info.st_nlink > 1:
            self._links[key] = name

    def _emit(self, member: tarfile.TarInfo, data: _LiveFile | None = None) -> None:
        """One entry: its header counted (and hashed), decided, written, its data after it."""
        self.stats.entries += 1
        if self.stats.entries > self._max_entries:
            raise InvalidArgumentError(self._tree.where, f"has more than {self._max_entries} entries")
        header = member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        padded = member.size + (-member.size % _BLOCK)
        self._tar.check(len(header) + padded)
        self._tar.add(header)
        kind = _KINDS.get(member.type, Kind.FILE)
        entry = entries.Entry(member.name, kind, member.mode, member.size, member.linkname)
        action = entries.decide(entry, where=self._tree.where, max_entry_bytes=self._budget)
        apply_action(action, data or _NO_DATA, entry, self._tree, self.stats)
        if data is not None and not data.copied:
            data.skip()
        self._tar.zeros(padded - member.size)
        self._tree.trim()


class _NoData:
    def copy_to(self, fd: int) -> None:
        raise AssertionError("an entry without data was asked for its data")


_NO_DATA = _NoData()


def _info(name: str, kind: bytes, info: os.stat_result | None) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.mode = stat.S_IMODE(info.st_mode) if info is not None else 0o644
    member.mtime = int(info.st_mtime) if info is not None else 0
    member.uid = member.gid = 0  # the store owns what it holds; an image's User says who runs it
    return member


def capture_layer(
    trees: list[Tree], dest: Path, *, budget: int, where: str, max_entries: int, content: bool = True
) -> LayerRecord:
    """Write `trees` as one layer into `dest` (a new directory under the store's staging/),
    refusing past `budget` bytes of tar (RESOURCE_EXHAUSTED naming the store's bound); named by
    its content's digest, or (`content` False) by a random one (see the module's doc)."""
    tar = _TarBytes(content=content, budget=budget, where=where)
    dest.mkdir(mode=0o755)
    layer = LayerTree(os.open(dest, _DIR_FLAGS), where)
    try:
        capture = _Capture(layer, tar, budget=budget, max_entries=max_entries)
        capture.run(trees)
    finally:
        layer.forget()
        os.close(layer.root)
    stats = capture.stats
    return LayerRecord(
        digest=tar.digest(),
        size=tar.count,
        entries=stats.entries,
        files=stats.files,
        whiteouts=tuple(stats.whiteouts),
        opaque=tuple(stats.opaque),
        by_content=content,
    )
