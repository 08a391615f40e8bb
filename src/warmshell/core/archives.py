"""What a tar entry from a client may be, decided without touching a file system (pure, shared
by the gateway's drivers and the supervisor that unpacks inside a pod).

An archive is untrusted input: its names land relative to a destination directory, so a name
must stay below it, and a symbolic link must point at something below it too (a link that leads
out would let a later entry, or the workload, write through it to a place the caller never named).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["ArchiveLimits", "ArchiveSummary", "EntryRefused", "entry_path", "link_stays_inside", "regroup"]


class EntryRefused(ValueError):
    """A tar entry that is never unpacked; the message names the entry and the rule."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds of one archive transfer: its entries, and the bytes of its files' content."""

    max_entries: int
    max_bytes: int


@dataclass(frozen=True)
class ArchiveSummary:
    """What an unpack wrote: entries (files, directories, links) and content bytes."""

    entries: int
    bytes_written: int


MAX_NAME_BYTES = 4096


def entry_path(name: str) -> str:
    """A tar entry's name as a relative, normalised path below the destination ("./a//b/" ->
    "a/b"; "." or "" -> "" for the destination itself). Refused: an absolute name, a `..`
    component anywhere (even one that would normalise away: a packer that writes them is not to be
    trusted with the rest), a NUL byte, an over-long name."""
    if "\0" in name:
        raise EntryRefused(f"{name!r}: a NUL byte in the name")
    if len(name.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
        raise EntryRefused(f"{name[:64]!r}...: longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/"):
        raise EntryRefused(f"{name!r}: an absolute name (entries are relative to the destination)")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise EntryRefused(f"{name!r}: a '..' component")
    return "/".join(parts)


def link_stays_inside(path: str, target: str) -> bool:
    """Whether a symbolic link at `path` (relative to the destination) pointing at `target`
    resolves, lexically, to the destination or below it. Absolute targets are refused: what they
    name depends on where the archive lands."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    # Relative normalisation keeps a leading "..": a target that climbs above the destination.
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return not (resolved == ".." or resolved.startswith("../"))


def regroup(pieces: Iterable[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """Pieces of an archive (headers, content, padding) regrouped into chunks of `chunk_bytes`
    (the last may be shorter): few, full messages on the wire. A piece that is a whole chunk on
    a boundary passes as it is, uncopied."""
    buffer = bytearray()
    for piece in pieces:
        if not buffer and len(piece) == chunk_bytes:
            yield piece
            continue
        buffer += piece
        while len(buffer) >= chunk_bytes:
            yield bytes(buffer[:chunk_bytes])
            del buffer[:chunk_bytes]
    if buffer:
        yield bytes(buffer)
