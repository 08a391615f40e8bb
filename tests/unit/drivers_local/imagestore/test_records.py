"""The index's JSON form: a layer's `by_content` and `boot_id` survive a round trip and are written
only when they differ from the default, so a store with no untagged snapshot and no fork's layer
keeps the form older gateways read; which images a reboot made stale (they name an unsynced layer)."""

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


def _image(digest: str, *layers: str) -> ImageRecord:
    config = ImageConfig(os="linux", architecture="amd64", created="", diff_ids=layers)
    return ImageRecord(digest, "sha256:" + "c" * 64, config, layers, "linux/amd64", 0)


def test_a_layers_boot_id_round_trips_and_is_written_only_when_set() -> None:
    synced = LayerRecord("sha256:" + "d" * 64, 512)
    fork = LayerRecord("sha256:" + "e" * 64, 512, by_content=False, boot_id="boot-1")
    index = Index(layers={synced.digest: synced, fork.digest: fork})
    data = index.to_json()
    assert "boot_id" not in data["layers"][synced.digest]
    assert data["layers"][fork.digest]["boot_id"] == "boot-1"
    assert Index.from_json(data).layers == index.layers


def test_the_images_naming_an_unsynced_layer_of_another_boot_are_stale() -> None:
    layers = [
        LayerRecord("sha256:" + c * 64, 512, boot_id=boot) for c, boot in (("1", ""), ("2", "now"), ("3", "before"))
    ]
    base, now, before = (layer.digest for layer in layers)
    images = [_image("sha256:a" + "0" * 63, base), _image("sha256:b" + "0" * 63, base, now)]
    images.append(_image("sha256:c" + "0" * 63, base, before))
    images.append(_image("sha256:d" + "0" * 63, base, before, "sha256:" + "9" * 64))  # on top of it
    index = Index(images={image.digest: image for image in images}, layers={layer.digest: layer for layer in layers})
    assert index.unsynced_from_other_boots("now") == [images[2].digest, images[3].digest]
    assert index.unsynced_from_other_boots("before") == [images[1].digest]
