"""What a path in a sandbox names, as the files API reports it (pure data, shared by the
gateway's drivers and the supervisor that runs file operations inside a pod)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FileEntry", "FileKind"]


class FileKind(StrEnum):
    """What a path names (the wire's FileInfo.type)."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"  # a FIFO, socket or device node: listed, never opened


@dataclass(frozen=True)
class FileEntry:
    """One file's metadata (not following a final symlink)."""

    name: str
    kind: FileKind
    size: int
    mode: int  # permission bits, 07777
    mtime_ms: int
    link_target: str = ""
