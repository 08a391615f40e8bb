"""Tar streams on the client's side of a bulk transfer: a local directory or a set of in-memory
files packed a chunk at a time (so a large tree never sits in memory), and a downloaded archive
unpacked into a local directory with tarfile's `data` filter (no absolute names, nothing outside
the destination, no device nodes; modes and mtimes kept).

The packer emits only directories, regular files and symbolic links, never hard links (the
gateway refuses them): a file linked twice travels twice.
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "ChunkReader",
    "LocalContent",
    "Plan",
    "common_directory",
    "pack_directory",
    "pack_files",
    "pack_plan",
    "pieces_of",
    "plan_directory",
    "planned_size",
    "unpack_into",
]

_BLOCK = tarfile.BLOCKSIZE
READ_BYTES = _READ = 1024 * 1024


def _header(name: str, kind: bytes, mode: int, mtime: float, size: int = 0, link: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.size, info.linkname = kind, mode, int(mtime), size, link
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> bytes:
    return bytes(-size % _BLOCK)


@dataclass(frozen=True)
class LocalContent:
    """A regular file's content in a planned tar: the header before it announced `size` bytes."""

    path: str
    size: int

    def chunks(self) -> Iterator[bytes]:
        """Exactly `size` bytes of the file, a megabyte at a time (OSError if it shrank)."""
        with open(self.path, "rb") as handle:
            left = self.size
            while left:
                data = handle.read(min(left, _READ))
                if not data:
                    raise OSError(f"{self.path}: shrank while being read")
                left -= len(data)
                yield data


# A planned tar: its headers and padding as bytes, each regular file's content to read or send.
Plan = list[bytes | LocalContent]


def plan_directory(local: str | os.PathLike[str]) -> Plan:
    """The tar of a local directory's entries as `pack_directory` packs them, with each file's
    content left in its file (so that it can be sent from there) and the sizes known at once."""
    return list(_walk(_directory(local)))


def planned_size(plan: Plan) -> int:
    """The bytes of the tar a plan describes."""
    return sum(len(piece) if isinstance(piece, bytes) else piece.size for piece in plan)


def pack_plan(plan: Iterable[bytes | LocalContent]) -> Iterator[bytes]:
    """A plan's tar in pieces, each file's content read as it comes."""
    for piece in plan:
        if isinstance(piece, bytes):
            yield piece
        else:
            yield from piece.chunks()


def pack_directory(local: str | os.PathLike[str]) -> Iterator[bytes]:
    """The tar of a local directory's entries, named relative to it (symbolic links as links;
    sockets, FIFOs and devices left out); NotADirectoryError now, not once read."""
    return pack_plan(_walk(_directory(local)))


def _directory(local: str | os.PathLike[str]) -> str:
    top = os.fspath(local)
    if not os.path.isdir(top):
        raise NotADirectoryError(f"{top}: not a directory")
    return top


def _walk(top: str) -> Iterator[bytes | LocalContent]:
    for directory, subdirs, names in os.walk(top):
        subdirs.sort()
        relative = os.path.relpath(directory, top)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        for name in sorted(subdirs + names):
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                yield _header(prefix + name, tarfile.SYMTYPE, 0o777, st.st_mtime, link=os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                yield _header(prefix + name, tarfile.DIRTYPE, stat.S_IMODE(st.st_mode), st.st_mtime)
            elif stat.S_ISREG(st.st_mode):
                yield _header(prefix + name, tarfile.REGTYPE, stat.S_IMODE(st.st_mode), st.st_mtime, st.st_size)
                yield LocalContent(path, st.st_size)
                yield _padding(st.st_size)
    yield bytes(2 * _BLOCK)


def common_directory(paths: Iterable[str]) -> str:
    """The deepest directory holding every one of these absolute paths (the upload's destination)."""
    parents = [posixpath.dirname(posixpath.normpath(p)) for p in paths]
    if not parents:
        raise ValueError("files: at least one file to write")
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"files: {path!r} must be absolute (as the sandbox sees it)")
    return posixpath.commonpath(parents)


def pack_files(files: Mapping[str, str | bytes], destination: str, mode: int) -> Iterator[bytes]:
    """The tar of in-memory files (absolute paths), named relative to `destination`."""
    return _in_memory(dict(files), destination, mode, time.time())


def _in_memory(files: dict[str, str | bytes], destination: str, mode: int, now: float) -> Iterator[bytes]:
    for path, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        name = posixpath.relpath(posixpath.normpath(path), destination)
        yield _header(name, tarfile.REGTYPE, mode, now, len(data))
        yield data
        yield _padding(len(data))
    yield bytes(2 * _BLOCK)


def pieces_of(archive: IO[bytes] | Iterable[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """A binary file read `chunk_bytes` at a time, or an iterable of bytes as it is."""
    if isinstance(archive, (bytes, bytearray, memoryview)):
        raise TypeError("archive: a binary file or an iterable of chunks, not bytes (wrap it in io.BytesIO)")
    read = getattr(archive, "read", None)
    if read is None:
        return iter(archive)
    return iter(lambda: read(chunk_bytes), b"")


class ChunkReader(io.RawIOBase):
    """An iterator of chunks read as a binary file (what tarfile's stream mode reads; wrap it in
    `io.BufferedReader`)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._head = memoryview(b"")

    def readable(self) -> bool:
        """Always."""
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        """Fill `buffer` from the current chunk (0 at the end)."""
        while not self._head:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._head = memoryview(chunk)
        size = min(len(buffer), len(self._head))
        buffer[:size] = self._head[:size]
        self._head = self._head[size:]
        return size


def unpack_into(source: IO[bytes], local: str | os.PathLike[str]) -> tuple[int, int]:
    """Unpack a tar stream into the local directory `local` (made when missing), refusing what
    the `data` filter refuses; (entries, bytes of the files' content)."""
    target = Path(local)
    target.mkdir(parents=True, exist_ok=True)
    counted = [0, 0]
    with tarfile.open(fileobj=source, mode="r|", bufsize=_READ) as archive:
        # A member's content copied a megabyte at a time (tarfile's default is 16 KiB: 320 reads
        # and writes for a 5 MiB file).
        archive.copybufsize = _READ  # type: ignore[attr-defined]  # not in typeshed, in tarfile since 3.8

        def members() -> Iterator[tarfile.TarInfo]:
            for member in archive:
                counted[0] += 1
                counted[1] += member.size if member.isreg() else 0
                yield member

        archive.extractall(target, members=members(), filter="data")
    return counted[0], counted[1]
