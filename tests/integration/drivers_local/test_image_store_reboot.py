"""A fork's image is committed without syncing (its children die with the host): on a real store,
the first open in another boot of the host removes it and its layer, one of this boot stays, an
index torn by a power loss after such a commit is never read (the last synced one is), and a
synced image on top of a fork's layer makes that layer durable."""

from __future__ import annotations

import json
from pathlib import Path

from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.imagestore.records import ImageRecord, LayerRecord
from warmshell.drivers.local.imagestore.store import ImageStore, StagedLayer, boot_id

_CONFIG = ImageConfig(os="linux", architecture="amd64", created="", diff_ids=())


def _commit(
    store: ImageStore, mark: str, *, tag: str = "", boot: str = "", sync: bool = True, under: tuple[str, ...] = ()
) -> ImageRecord:
    """One image of one staged one-file layer (on top of the layers `under`), committed as a
    snapshot would be: `boot` marks its layer unsynced."""
    layer = LayerRecord("sha256:" + mark * 64, 512, entries=1, files=1, by_content=False, boot_id=boot)
    stage = store.new_staging()
    (stage / "layer").mkdir()
    (stage / "layer" / "file").write_text(mark)
    layers = (*under, layer.digest)
    image = ImageRecord("sha256:" + mark.upper() * 64, "sha256:" + "c" * 64, _CONFIG, layers, "linux", 0)
    try:
        return store.commit(image, [StagedLayer(layer, stage / "layer")], [tag] if tag else [], sync=sync)
    finally:
        store.drop_staging(stage)


def _reopened(root: Path) -> ImageStore:
    store = ImageStore(root, max_bytes=1 << 30)
    store.open()
    return store


def test_an_unsynced_image_of_another_boot_goes_at_open_and_one_of_this_boot_stays(tmp_path: Path) -> None:
    store = _reopened(tmp_path)
    tagged = _commit(store, "a", tag="kept/snap:1")
    before_reboot = _commit(store, "b", boot="a-boot-before-this-one", sync=False)
    this_boot = _commit(store, "d", boot=boot_id(), sync=False)
    index = _reopened(tmp_path).index()
    assert set(index.images) == {tagged.digest, this_boot.digest}
    assert index.tags == {"kept/snap:1": tagged.digest}
    assert set(index.layers) == {tagged.layers[0], this_boot.layers[0]}
    assert not store.layer_path(before_reboot.layers[0]).exists()
    assert (store.layer_path(this_boot.layers[0]) / "file").read_text() == "d"


def test_an_index_torn_after_an_unsynced_commit_falls_back_to_the_last_synced_one(tmp_path: Path) -> None:
    store = _reopened(tmp_path)
    tagged = _commit(store, "a", tag="kept/snap:1")
    fork = _commit(store, "b", boot=boot_id(), sync=False)
    assert fork.digest in json.loads(store.index_file.read_bytes())["images"]
    size = store.index_file.stat().st_size
    store.index_file.write_bytes(b"\0" * size)  # the rename reached the disk, the data did not
    index = _reopened(tmp_path).index()
    assert set(index.images) == {tagged.digest}
    assert not store.layer_path(fork.layers[0]).exists()
    assert json.loads(store.index_file.read_bytes())["tags"] == {"kept/snap:1": tagged.digest}


def test_a_synced_image_on_a_forks_layer_forces_that_layer_to_disk_and_outlives_a_reboot(tmp_path: Path) -> None:
    store = _reopened(tmp_path)
    fork = _commit(store, "b", boot="a-boot-before-this-one", sync=False)
    paused = _commit(store, "d", under=fork.layers)  # a pause (or a tagged snapshot) of a fork's child
    assert not store.index().layers[fork.layers[0]].boot_id
    index = _reopened(tmp_path).index()
    assert set(index.images) == {fork.digest, paused.digest}
    assert (store.layer_path(fork.layers[0]) / "file").read_text() == "b"
