"""What becomes of one tar entry of a layer: written (at a normalised path, with a safe mode), a
whiteout, an opaque-directory marker, skipped, or the whole layer refused.

Pure, so the policy is tested over every entry a hostile archive could hold (tests/unit/drivers/
local/imagestore). The rules:
- paths are made relative (leading '/' and './' dropped, as GNU tar does); a '..' component, a
  NUL byte or an empty component is refused: an entry never names a place outside its layer;
- setuid, setgid (and the owner's missing read/write) are taken off the mode: the store's files
  belong to the store's owner and grant no privilege to whoever runs them;
- device nodes and FIFOs are skipped: a sandbox gets its /dev from the runtime, and a device
  node from an archive could open the host's disks;
- a hard link must name a path of the same layer by the same rules; a symbolic link's target is
  kept as it is (it is resolved inside the sandbox's own root, where neither '/' nor '..' leads
  out), and is never followed while the layer is written (`extracting`);
- `.wh.NAME` deletes NAME of the layers below, `.wh..wh..opq` hides the whole directory below.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from enum import Enum

from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError

__all__ = ["Entry", "Kind", "Opaque", "Skip", "Whiteout", "Write", "decide", "normalise"]

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
MAX_PATH_BYTES = 4096
MAX_DEPTH = 256


class Kind(Enum):
    """The kinds of tar entries."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    DEVICE = "device"
    FIFO = "fifo"
    OTHER = "other"


# Entry and Write are made once per entry of a layer (~9,000 in a Debian root) and live for one
# step of the loop: not frozen, since a frozen dataclass's __init__ costs ~0.4 us more (it sets
# each field through object.__setattr__), ~2% of an import's CPU. Nothing keeps or hashes them.
@dataclass(slots=True)
class Entry:
    """One tar entry as the archive states it."""

    name: str
    kind: Kind
    mode: int = 0o644
    size: int = 0
    link: str = ""


@dataclass(slots=True)
class Write:
    """Create `path` (components under the layer root) as `kind` with `mode`."""

    path: tuple[str, ...]
    kind: Kind
    mode: int
    size: int = 0
    link: str = ""  # a symlink's target as given; a hard link's source as normalised components
    link_path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Whiteout:
    """Hide `name` of the lower layers inside `parent`."""

    parent: tuple[str, ...]
    name: str


@dataclass(frozen=True, slots=True)
class Opaque:
    """Hide everything the lower layers have inside `directory`."""

    directory: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Skip:
    """Write nothing (`reason`, for the layer's record)."""

    reason: str


Action = Write | Whiteout | Opaque | Skip

# An enum member read through its class costs ~160 ns on Python 3.11 (a descriptor), and a
# layer's ~9,000 entries each read half a dozen: read once, here.
_FILE, _DIRECTORY, _SYMLINK, _HARDLINK = Kind.FILE, Kind.DIRECTORY, Kind.SYMLINK, Kind.HARDLINK
_NOT_STORED = frozenset({Kind.DEVICE, Kind.FIFO, Kind.OTHER})
_SAFE_BITS = 0o7777 & ~(stat.S_ISUID | stat.S_ISGID)
# A name of this many characters or fewer is under MAX_PATH_BYTES whatever it holds (at most
# 4 bytes a character), so it is not encoded to be measured.
_SHORT_NAME = MAX_PATH_BYTES // 4


def normalise(name: str, *, where: str) -> tuple[str, ...]:
    """The components of an entry's path under the layer root; InvalidArgumentError naming
    `where` and the entry for a path that would leave it."""
    if "\0" in name:
        raise InvalidArgumentError(where, f"entry {name!r} has a NUL byte in its path")
    if len(name) > _SHORT_NAME and len(name.encode(errors="surrogateescape")) > MAX_PATH_BYTES:
        raise InvalidArgumentError(where, f"entry {name[:64]!r}... has a path over {MAX_PATH_BYTES} bytes")
    parts = name.lstrip("/").removeprefix("./").split("/")
    if "" in parts or "." in parts:  # 'a//b', 'a/./b', a directory's trailing '/': not the most
        parts = [p for p in parts if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgumentError(where, f"entry {name!r} has a '..' component (it would leave the layer)")
    if len(parts) > MAX_DEPTH:
        raise InvalidArgumentError(where, f"entry {name[:64]!r}... is more than {MAX_DEPTH} directories deep")
    return tuple(parts)


def safe_mode(mode: int, kind: Kind) -> int:
    """The permission bits to store: no setuid/setgid, and the owner (the store) may always read
    and write (and enter a directory), so the store can verify and remove what it holds."""
    return (mode & _SAFE_BITS) | (0o700 if kind is _DIRECTORY else 0o600)


def decide(entry: Entry, *, where: str, max_entry_bytes: int, budget_key: str = "local.image_store_size") -> Action:
    """What to do with `entry` of the layer `where` (see the module doc); a file larger than
    `max_entry_bytes` (what is left under `budget_key`) is ResourceExhaustedError."""
    path = normalise(entry.name, where=where)
    if not path:
        return Skip("the layer's root") if entry.kind is _DIRECTORY else _refuse(entry, where, "names the root")
    base, kind = path[-1], entry.kind
    if base.startswith(WHITEOUT_PREFIX):
        if base == OPAQUE_MARKER:
            return Opaque(path[:-1])
        hidden = base.removeprefix(WHITEOUT_PREFIX)
        if hidden.startswith(WHITEOUT_PREFIX) or not hidden:
            return Skip(f"reserved whiteout name {base!r}")
        return Whiteout(path[:-1], hidden)
    if kind in _NOT_STORED:
        return Skip(f"{kind.value} entries are not stored")
    if kind is _FILE:
        if entry.size > max_entry_bytes:
            raise ResourceExhaustedError(
                f"{where}: entry {entry.name!r} is {entry.size} bytes, "
                f"more than the {max_entry_bytes} left under {budget_key}"
            )
        return Write(path, kind, safe_mode(entry.mode, kind), entry.size)
    if kind is _HARDLINK:
        source = normalise(entry.link, where=where)
        if not source or source == path:
            return _refuse(entry, where, f"is a hard link to {entry.link!r}, not another entry of the layer")
        return Write(path, kind, 0, link=entry.link, link_path=source)
    if kind is _SYMLINK:
        if not entry.link or "\0" in entry.link:
            return _refuse(entry, where, "is a symbolic link with an empty target or a NUL byte")
        return Write(path, kind, 0o777, link=entry.link)
    return Write(path, kind, safe_mode(entry.mode, kind))  # a directory: its stated size means nothing


def _refuse(entry: Entry, where: str, why: str) -> Action:
    raise InvalidArgumentError(where, f"entry {entry.name!r} {why}")
