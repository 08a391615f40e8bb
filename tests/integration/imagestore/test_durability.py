"""A durable commit (an import, a tagged snapshot, a pause) forces its layers to disk before the
index naming them is written; a fork's commit forces nothing. The store's sync is recorded (and
made to fail) to check the order, and a commit whose sync fails leaves nothing the next open
does not repair."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from tests.helpers import images
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.imagestore.records import ImageRecord, LayerRecord
from warmshell.drivers.local.imagestore.store import ImageStore, StagedLayer, boot_id, sync_filesystem

_CONFIG = ImageConfig(os="linux", architecture="amd64", created="", diff_ids=())


class RecordingSync:
    """The store's sync: records what the index on disk named at each call, then really syncs;
    the call numbered `fail_at` (from 1) fails as a disk's writeback error would."""

    def __init__(self, root: Path, *, fail_at: int = 0) -> None:
        self.root = root
        self.fail_at = fail_at
        self.calls: list[dict[str, object]] = []

    def __call__(self, path: Path) -> None:
        index_file = self.root / "index.json"
        named = json.loads(index_file.read_bytes()) if index_file.exists() else {"images": {}, "layers": {}}
        layers = {d: raw.get("boot_id", "") for d, raw in named["layers"].items()}
        self.calls.append({"path": path, "images": set(named["images"]), "layers": layers})
        if len(self.calls) == self.fail_at:
            raise OSError(errno.EIO, "writeback failed")
        sync_filesystem(path)


def _store(root: Path, **kwargs: int) -> tuple[ImageStore, RecordingSync]:
    recorder = RecordingSync(root, **kwargs)
    store = ImageStore(root, max_bytes=1 << 30, sync=recorder)
    store.open()
    return store, recorder


def _commit(
    store: ImageStore, mark: str, *, sync: bool = True, boot: str = "", under: tuple[str, ...] = ()
) -> ImageRecord:
    layer = LayerRecord("sha256:" + mark * 64, 512, entries=1, files=1, by_content=False, boot_id=boot)
    stage = store.new_staging()
    (stage / "layer").mkdir()
    (stage / "layer" / "file").write_text(mark)
    image = ImageRecord(
        "sha256:" + mark.upper() * 64, "sha256:" + "c" * 64, _CONFIG, (*under, layer.digest), "linux", 0
    )
    try:
        return store.commit(image, [StagedLayer(layer, stage / "layer")], [], sync=sync)
    finally:
        store.drop_staging(stage)


def test_an_import_syncs_its_layers_before_the_index_names_them(tmp_path: Path) -> None:
    images.write_oci_layout(tmp_path / "layout", images.slow_layers(2, files=3, file_bytes=1024))
    store, recorder = _store(tmp_path / "store")
    image, _ = import_image(store, tmp_path / "layout", name="durable:1")
    assert [call["path"] for call in recorder.calls] == [store.root]
    assert recorder.calls[0]["images"] == set()
    assert image.digest in json.loads(store.index_file.read_bytes())["images"]


def test_a_forks_commit_syncs_nothing_and_a_pause_of_its_child_syncs_its_layer_before_clearing_the_mark(
    tmp_path: Path,
) -> None:
    store, recorder = _store(tmp_path)
    fork = _commit(store, "a", sync=False, boot=boot_id())
    assert recorder.calls == []
    paused = _commit(store, "b", under=fork.layers)
    # Once before the lock (the staged layer), once under it (the fork's layer it names), both
    # while the index on disk still names neither the paused image nor the fork layer as synced.
    assert len(recorder.calls) == 2
    for call in recorder.calls:
        assert call["images"] == {fork.digest}
        assert call["layers"] == {fork.layers[0]: boot_id()}
    assert store.index().layers[fork.layers[0]].boot_id == ""
    assert paused.digest in store.index().images


@pytest.mark.parametrize("fail_at", [1, 2], ids=["before-the-lock", "under-the-lock"])
def test_a_failed_sync_fails_the_commit_and_the_next_open_leaves_no_trace(tmp_path: Path, fail_at: int) -> None:
    store, _ = _store(tmp_path, fail_at=fail_at)
    fork = _commit(store, "a", sync=False, boot=boot_id())
    with pytest.raises(OSError, match="writeback failed"):
        _commit(store, "b", under=fork.layers)
    index = store.index()
    assert set(index.images) == {fork.digest}
    assert index.layers[fork.layers[0]].boot_id == boot_id()
    reopened, _ = _store(tmp_path)
    assert set(reopened.index().layers) == {fork.layers[0]}
    assert [p.name for p in (tmp_path / "layers" / "sha256").iterdir()] == [fork.layers[0].removeprefix("sha256:")]
    assert list((tmp_path / "staging").iterdir()) == []


def test_sync_filesystem_syncs_a_directory_and_refuses_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    sync_filesystem(tmp_path)
    with pytest.raises(NotADirectoryError):
        sync_filesystem(tmp_path / "file")
