"""Images of the image store as sandbox roots: a reference pinned to its digest, and the layers of
the images live sandboxes use held on disk.

A create or a profile names an image by `NAME:TAG`, `NAME@sha256:HEX` or the digest; it is pinned
once (`NAME:TAG@sha256:HEX`), so what a sandbox runs, what `sandbox get` shows and what a pool's
fingerprint holds is the digest, whatever the tag names later. Each start then acquires the pinned
image (its layers held: see `ImageStore.hold`) and each end releases it. The overlay itself is
mounted by `warmshell-launch` (see its source): capabilities are gone once bwrap runs.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.errors import InvalidArgumentError, NotFoundError
from warmshell.drivers.local.imagestore import references
from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.imagestore.records import ImageRecord, Index
from warmshell.drivers.local.imagestore.store import ImageStore

__all__ = ["NOT_FOUND", "ImageNotFoundError", "ImageRoot", "ImageRoots", "default_command", "is_reference", "user_ids"]

_HOW = "warmshell image import SOURCE --name NAME:TAG"
NOT_FOUND = "ImageNotFound"  # the reason a pool whose image the store does not have reports


class ImageNotFoundError(InvalidArgumentError):
    """The image a create or profile names is not in the store."""


def user_ids(user: str, layers: tuple[Path, ...], *, field: str) -> tuple[int, int]:
    """The uid and gid an image's `User` (`UID[:GID]` or `NAME[:GROUP]`, names looked up in the
    image's own /etc/passwd and /etc/group, the top layer holding one first) stands for inside the
    sandbox; InvalidArgumentError naming `field` when a name is in neither. Whatever they are,
    the sandbox's host uid is its own: the ids only name it inside its user namespace."""
    name, _, group = user.partition(":")
    uid = _lookup(name or "0", "passwd", layers, field=field)
    gid = _lookup(group, "group", layers, field=field) if group else _primary_gid(name, uid, layers)
    return uid, gid


def _lookup(name: str, table: str, layers: tuple[Path, ...], *, field: str) -> int:
    if name.isdigit():
        return int(name)
    for entry in _table(table, layers):
        if entry[0] == name and len(entry) > 2 and entry[2].isdigit():
            return int(entry[2])
    raise InvalidArgumentError(field, f"the image's User names {name!r}, which its /etc/{table} does not have")


def _primary_gid(name: str, uid: int, layers: tuple[Path, ...]) -> int:
    for entry in _table("passwd", layers):
        if (entry[0] == name or entry[2:3] == [str(uid)]) and len(entry) > 3 and entry[3].isdigit():
            return int(entry[3])
    return uid


def _table(table: str, layers: tuple[Path, ...]) -> list[list[str]]:
    for layer in layers:  # top first: the first layer holding the file has the image's version
        path = layer / "etc" / table
        if path.is_file() and not path.is_symlink():
            return [line.split(":") for line in path.read_text(errors="replace").splitlines()]
    return []


def default_command(config: ImageConfig) -> list[str]:
    """What a sandbox of the image runs when its request names no command: Entrypoint + Cmd, as
    docker and Kubernetes start a container given neither (empty: the image has neither)."""
    return [*config.entrypoint, *config.cmd]


def is_reference(image: str) -> bool:
    """Whether `image` names an image of the store ("" is the host root, an absolute path a
    root filesystem directory under `local.image_roots`)."""
    return bool(image) and not os.path.isabs(image)


@dataclass(frozen=True)
class ImageRoot:
    """A stored image as a sandbox's root: its layers (top first, as overlayfs takes them)."""

    pinned: str
    digest: str
    layers: tuple[Path, ...]
    config: ImageConfig
    uid: int = 0  # the image's User, inside the sandbox (its host uid is the sandbox's own)
    gid: int = 0
    workspace: bool = False  # its layers hold /workspace (a snapshot's): no fresh tmpfs there

    @property
    def environment(self) -> dict[str, str]:
        """The image's Env as a mapping (a later entry of a name wins, as in a runtime)."""
        return dict(entry.partition("=")[::2] for entry in self.config.env if "=" in entry)


# References pinned per index snapshot at most (each create names one; a flood of distinct
# names must not grow the gateway's memory).
_PINS_KEPT = 256


@dataclass
class _Snapshot:
    key: tuple[int, int, int]  # the index file's mtime, size and inode
    index: Index
    pins: dict[str, tuple[str, ImageRecord]] = dataclasses.field(default_factory=dict)  # text -> pinned, image


@dataclass
class _Held:
    root: ImageRoot
    fds: list[int]
    users: int = 0


class ImageRoots:
    """Pins references and holds the layers of images in use (blocking: the store reads its
    index; thread-safe, as sandboxes are prepared in several threads)."""

    def __init__(self, store: ImageStore) -> None:
        self._store = store
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._index_file = store.index_file
        # The index as last read, by the identity of its file, with what each reference pinned
        # to in it: every create from an image pins it in the event loop (twice: the gateway's
        # validation and the driver's), and one stat and a lookup cost far less than a read
        # under the store's lock, or parsing and resolving the reference again (~0.1 ms).
        self._index: _Snapshot | None = None

    @property
    def store(self) -> ImageStore:
        """The store the images come from (snapshots are committed to it)."""
        return self._store

    @property
    def watched(self) -> tuple[Path, ...]:
        """What changes when a tag is pointed elsewhere (pools pin their image again then)."""
        return (self._store.index_file,)

    def pin(self, text: str, *, field: str = "spec.image") -> str:
        """`text` pinned to the digest it names now (`NAME:TAG@sha256:HEX`, or the digest);
        InvalidArgumentError naming `field`, saying how to import it, when the store has none."""
        return self._pinned(text, field=field)[0]

    def config(self, pinned: str, *, field: str = "spec.image") -> ImageConfig:
        """The config of the image a pinned reference names (InvalidArgumentError naming `field`
        when the store no longer has it)."""
        return self._pinned(pinned, field=field)[1].config

    def _pinned(self, text: str, *, field: str) -> tuple[str, ImageRecord]:
        """`text` pinned, and its image, from the index now (kept with that snapshot)."""
        snapshot = self._snapshot(text, field=field)
        found = snapshot.pins.get(text)
        if found is None:
            ref = references.parse_reference(text, field=field)
            image = self._image(text, field=field, snapshot=snapshot)
            found = (str(references.Reference(name=ref.name, tag=ref.tag, digest=image.digest)), image)
            if len(snapshot.pins) < _PINS_KEPT:
                snapshot.pins[text] = found
        return found

    def _snapshot(self, text: str, *, field: str) -> _Snapshot:
        """The index now (read again only when its file changed)."""
        try:
            info = os.stat(self._index_file)
        except FileNotFoundError:  # no image was ever imported: no store yet
            raise ImageNotFoundError(
                field, f"no image {text!r}: the image store is empty; import it first: {_HOW}"
            ) from None
        key = (info.st_mtime_ns, info.st_size, info.st_ino)
        snapshot = self._index
        if snapshot is None or snapshot.key != key:
            # A new snapshot, pins and all: a pin made from the old index stays with it.
            snapshot = self._index = _Snapshot(key, self._store.index())
        return snapshot

    def _image(self, text: str, *, field: str, snapshot: _Snapshot | None = None) -> ImageRecord:
        snapshot = snapshot or self._snapshot(text, field=field)
        try:
            return self._store.resolve(text, field=field, index=snapshot.index)
        except NotFoundError as exc:
            raise ImageNotFoundError(field, str(exc)) from exc

    def _resolve(self, text: str, *, field: str) -> ImageRoot:
        image = self._image(text, field=field)
        layers = tuple(self._store.layer_path(d) for d in reversed(image.layers))
        uid, gid = user_ids(image.config.user, layers, field=field)
        return ImageRoot(
            pinned=text,
            digest=image.digest,
            layers=layers,
            config=image.config,
            uid=uid,
            gid=gid,
            workspace=image.workspace,
        )

    def acquire(self, pinned: str) -> ImageRoot:
        """The image a pinned reference names, its layers held until as many `release`s; an
        image removed meanwhile is InvalidArgumentError (its layers were not held)."""
        with self._lock:
            held = self._held.get(pinned)
            if held is None:
                root = self._resolve(pinned, field="spec.image")
                digests = tuple(f"sha256:{path.name}" for path in root.layers)
                held = self._held[pinned] = _Held(root, self._store.hold(digests))
            held.users += 1
            return held.root

    def release(self, pinned: str) -> None:
        """One user of `pinned` is gone; the last one lets its layers go."""
        with self._lock:
            held = self._held.get(pinned)
            if held is None:
                return
            held.users -= 1
            if held.users <= 0:
                del self._held[pinned]
                self._store.release(held.fds)
