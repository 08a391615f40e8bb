"""Images of the image store as sandbox roots: a reference pinned to its digest, and the layers of
the images live sandboxes use held on disk.

A create or a profile names an image by `NAME:TAG`, `NAME@sha256:HEX` or the digest; it is pinned
once (`NAME:TAG@sha256:HEX`), so what a sandbox runs, what `sandbox get` shows and what a pool's
fingerprint holds is the digest, whatever the tag names later. Each start then acquires the pinned
image (its layers held: see `ImageStore.hold`) and each end releases it. The overlay itself is
mounted by `warmshell-launch` (see its source): capabilities are gone once bwrap runs.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.errors import InvalidArgumentError, NotFoundError
from warmshell.drivers.local.imagestore import references
from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.imagestore.store import ImageStore

__all__ = ["NOT_FOUND", "ImageNotFoundError", "ImageRoot", "ImageRoots", "is_reference"]

_HOW = "warmshell image import SOURCE --name NAME:TAG"
NOT_FOUND = "ImageNotFound"  # the reason a pool whose image the store does not have reports


class ImageNotFoundError(InvalidArgumentError):
    """The image a create or profile names is not in the store."""


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

    @property
    def watched(self) -> tuple[Path, ...]:
        """What changes when a tag is pointed elsewhere (pools pin their image again then)."""
        return (self._store.index_file,)

    def pin(self, text: str, *, field: str = "spec.image") -> str:
        """`text` pinned to the digest it names now (`NAME:TAG@sha256:HEX`, or the digest);
        InvalidArgumentError naming `field`, saying how to import it, when the store has none."""
        ref = references.parse_reference(text, field=field)
        image = self._resolve(text, field=field)
        return str(references.Reference(name=ref.name, tag=ref.tag, digest=image.digest))

    def _resolve(self, text: str, *, field: str) -> ImageRoot:
        try:
            if not self._store.root.is_dir():  # no image was ever imported: no store yet
                raise NotFoundError(f"no image {text!r}: the image store is empty; import it first: {_HOW}")
            image = self._store.resolve(text, field=field)
        except NotFoundError as exc:
            raise ImageNotFoundError(field, str(exc)) from exc
        layers = tuple(self._store.layer_path(d) for d in reversed(image.layers))
        return ImageRoot(pinned=text, digest=image.digest, layers=layers, config=image.config)

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
