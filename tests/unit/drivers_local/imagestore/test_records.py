"""The index's JSON form: a layer's `by_content` and an image's `boot_id` survive a round trip and
are written only when they differ from the default, so a store with no untagged snapshot and no
fork's image keeps the form older gateways read; which unsynced images a reboot made stale."""

from __future__ import annotations

from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.imagestore.records import ImageRecord, Index, LayerRecord


def test_layers_round_trip_and_only_an_untagged_snapshots_says_so() -> None:
    named = LayerRecord("sha256:" + "a" * 64, 2048, entries=3, files=1, whiteouts=("etc/x",), opaque=("opt",))
    random = LayerRecord("sha256:" + "b" * 64, 1024, by_content=False)
    index = Index(layers={named.digest: named, random.digest: random})
    data = index.to_json()
    assert "by_content" not in data["layers"][named.digest]
    assert data["layers"][random.digest]["by_content"] is False
    assert Index.from_json(data).layers == index.layers


def _image(digest: str, boot_id: str = "") -> ImageRecord:
    config = ImageConfig(os="linux", architecture="amd64", created="", diff_ids=())
    return ImageRecord(digest, "sha256:" + "c" * 64, config, (), "linux/amd64", 0, boot_id=boot_id)


def test_an_images_boot_id_round_trips_and_is_written_only_when_set() -> None:
    durable, fork = _image("sha256:" + "d" * 64), _image("sha256:" + "e" * 64, boot_id="boot-1")
    index = Index(images={durable.digest: durable, fork.digest: fork})
    data = index.to_json()
    assert "boot_id" not in data["images"][durable.digest]
    assert data["images"][fork.digest]["boot_id"] == "boot-1"
    assert Index.from_json(data).images == index.images


def test_only_unsynced_images_of_another_boot_are_stale() -> None:
    images = [_image("sha256:" + c * 64, boot) for c, boot in (("1", ""), ("2", "now"), ("3", "before"))]
    index = Index(images={image.digest: image for image in images})
    assert index.unsynced_from_other_boots("now") == [images[2].digest]
    assert index.unsynced_from_other_boots("before") == [images[1].digest]
