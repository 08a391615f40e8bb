"""Pinning image references to digests (`imageroots.ImageRoots.pin`), against a real image store:
what a reference pins to follows the store's index, and the pins kept between changes are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import images
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore
from warmshell.drivers.local.runtime import imageroots


def _import(store: ImageStore, work: Path, marker: str, name: str) -> str:
    layout = work / marker
    images.write_oci_layout(layout, [images.Layer().file("marker", marker.encode()).tar()])
    image, _ = import_image(store, layout, name=name)
    return image.digest


def test_a_pin_follows_the_tag_to_its_current_digest(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images", max_bytes=1 << 30)
    store.open()
    roots = imageroots.ImageRoots(store)
    with pytest.raises(imageroots.ImageNotFoundError, match="import it first"):
        roots.pin("app:1")
    first = _import(store, tmp_path, "one", "app:1")
    pinned = roots.pin("app:1")
    assert pinned == f"app:1@{first}"
    assert roots.pin(pinned) == pinned  # a pinned reference pins to itself
    assert roots.pin("app:1") == pinned  # again, from what was kept
    second = _import(store, tmp_path, "two", "app:1")  # the tag moves: the index file changes
    assert second != first
    assert roots.pin("app:1") == f"app:1@{second}"
    assert roots.pin(pinned) == pinned  # the digest itself is still in the store
    with pytest.raises(imageroots.ImageNotFoundError, match=r"spec\.image"):
        roots.pin("other:1")


def test_the_pins_kept_are_bounded(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images", max_bytes=1 << 30)
    store.open()
    digest = _import(store, tmp_path, "one", "app:1")
    roots = imageroots.ImageRoots(store)
    for n in range(imageroots._PINS_KEPT + 50):
        # Distinct texts naming the one image: the digest with a name of each's own.
        assert roots.pin(f"name{n}@{digest}") == f"name{n}@{digest}"
    assert roots._index is not None
    assert len(roots._index.pins) == imageroots._PINS_KEPT
