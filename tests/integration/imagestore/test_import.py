"""Imports into a real store on disk: the three source formats, layers shared, whiteouts as
overlayfs reads them, and bad or hostile input refused with nothing left behind."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from tests.helpers import images
from tests.helpers.images import Layer
from warmshell.core.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from warmshell.drivers.local.imagestore.extracting import OPAQUE_XATTR, WHITEOUT_XATTR
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    opened = ImageStore(tmp_path / "store", max_bytes=64 << 20)
    opened.open()
    return opened


@pytest.fixture(scope="module")
def base() -> bytes:
    return images.host_shell_layer().tar()


def assert_empty(store: ImageStore) -> None:
    index = store.index()
    assert (index.tags, index.images, index.layers) == ({}, {}, {})
    assert list((store.root / "layers" / "sha256").iterdir()) == []
    assert list((store.root / "staging").iterdir()) == []


def test_the_three_formats_import_and_share_layers(store: ImageStore, base: bytes, tmp_path: Path) -> None:
    top = Layer().file("app/run", b"#!/bin/sh\necho hi\n", mode=0o755).tar()
    digest = images.write_oci_layout(tmp_path / "layout", [base, top], ref_name="test/app:1")
    image, tags = import_image(store, tmp_path / "layout")
    assert (image.digest, tags) == (digest, ["test/app:1"])
    images.tar_directory(tmp_path / "layout", tmp_path / "oci.tar")
    again, tags = import_image(store, tmp_path / "oci.tar", name="test/app:archive")
    assert again.digest == digest
    images.write_docker_save(tmp_path / "save.tar", [base], repo_tags=["test/base:docker"])
    saved, tags = import_image(store, tmp_path / "save.tar")
    assert tags == ["test/base:docker"]
    assert saved.source_format == "docker"
    index = store.index()
    assert len(index.layers) == 2
    assert index.usage() == len(base) + len(top)
    assert sorted(index.tags) == ["test/app:1", "test/app:archive", "test/base:docker"]
    marker = store.layer_path(image.layers[0]) / images.MARKER.strip("/")
    assert marker.read_text() == "built by the tests"
    assert store.resolve("test/app:1").config.cmd == ("/bin/sh",)


def test_zstd_layers_import(store: ImageStore, base: bytes, tmp_path: Path) -> None:
    images.write_oci_layout(tmp_path / "layout", [base], zstd=True)
    image, _ = import_image(store, tmp_path / "layout", name="zstd")
    assert (store.layer_path(image.layers[0]) / images.MARKER.strip("/")).read_text() == "built by the tests"


def test_whiteouts_are_what_overlayfs_hides(store: ImageStore, base: bytes, tmp_path: Path) -> None:
    lower = Layer().directory("d").file("d/gone", b"x").file("d/kept", b"k").directory("o").file("o/old", b"o").tar()
    upper = Layer().file("d/.wh.gone").directory("o").file("o/.wh..wh..opq").file("o/new", b"n").tar()
    images.write_oci_layout(tmp_path / "layout", [lower, upper], compress=False)
    image, _ = import_image(store, tmp_path / "layout", name="wh")
    top = store.layer_path(image.layers[1])
    assert os.getxattr(top / "d" / "gone", WHITEOUT_XATTR) == b""
    assert os.getxattr(top / "d", OPAQUE_XATTR) == b"x"
    assert os.getxattr(top / "o", OPAQUE_XATTR) == b"y"
    mount = tmp_path / "m"
    for name in ("m", "up", "work"):
        (tmp_path / name).mkdir()
    lowers = ":".join(str(store.layer_path(d)) for d in reversed(image.layers))
    script = (
        f"mount -t overlay overlay -o userxattr,lowerdir={lowers},upperdir={tmp_path}/up,workdir={tmp_path}/work "
        f"{mount} && ls {mount}/d && ls {mount}/o"
    )
    shown = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True)
    if shown.returncode != 0 and "mount" in shown.stderr:
        pytest.skip(f"no overlayfs in a user namespace here: {shown.stderr.strip()}")
    assert shown.stdout.split() == ["kept", "new"]


@pytest.mark.parametrize(
    ("spoil", "complaint"),
    [
        ("flip", "has digest sha256:"),
        ("missing", "missing from the"),
        ("media", "unknown layer media type"),
        ("config", "not JSON"),
        ("truncate", "truncated"),
    ],
)
def test_bad_input_names_file_and_digest_and_leaves_nothing(
    store: ImageStore, base: bytes, tmp_path: Path, spoil: str, complaint: str
) -> None:
    layout = tmp_path / "layout"
    layer = Layer().file("a", b"a" * 100_000).tar()
    images.write_oci_layout(
        layout,
        [base, layer],
        compress=spoil != "flip",
        layer_media_type="application/x-foreign" if spoil == "media" else "",
        config=b"{oops" if spoil == "config" else None,
    )
    blob_data = layer if spoil == "flip" else gzip.compress(layer, mtime=0)
    blob = layout / "blobs" / "sha256" / images.sha256(blob_data).removeprefix("sha256:")
    source = layout
    if spoil == "flip":
        data = bytearray(blob.read_bytes())
        data[-10] ^= 0xFF
        blob.write_bytes(bytes(data))
    elif spoil == "missing":
        blob.unlink()
    elif spoil == "truncate":
        images.tar_directory(layout, tmp_path / "oci.tar")
        source = tmp_path / "cut.tar"
        source.write_bytes((tmp_path / "oci.tar").read_bytes()[: blob.stat().st_size // 2 + 30_000])
    with pytest.raises(InvalidArgumentError) as caught:
        import_image(store, source, name="bad")
    assert complaint in str(caught.value)
    if spoil in ("flip", "missing"):
        assert blob.name in str(caught.value)
        assert f"sha256:{blob.name}" in str(caught.value)
    assert_empty(store)


@pytest.mark.parametrize(
    ("layer", "complaint"),
    [
        (Layer().file("../escape", b"x"), "'..'"),
        (Layer().link("l", "/etc").file("l/passwd", b"x"), "passes through a symbolic link"),
        # A directory written to, then replaced by a link: nothing written later goes through it.
        (Layer().directory("a").file("a/f").link("a", "/etc").file("a/passwd"), "passes through a symbolic link"),
        # A link replaced by a file, then written through: the file is no directory.
        (Layer().link("a", "/etc").file("a").file("a/passwd"), "passes through a symbolic link or a file"),
        (Layer().link("h", "../../etc/shadow", hard=True), "'..'"),
        (Layer().link("h", "etc/shadow", hard=True), "not a file of the layer"),
        (Layer().directory("d").link("h", "d", hard=True), "not a file of the layer"),
    ],
)
def test_hostile_layers_are_refused(store: ImageStore, tmp_path: Path, layer: Layer, complaint: str) -> None:
    images.write_oci_layout(tmp_path / "layout", [layer.tar()])
    with pytest.raises(InvalidArgumentError, match=complaint):
        import_image(store, tmp_path / "layout", name="hostile")
    assert_empty(store)
    assert not (tmp_path / "escape").exists()


def test_hostile_entries_are_neutralised(store: ImageStore, tmp_path: Path) -> None:
    layer = (
        Layer()
        .file("/abs", b"x")
        .file("suid", b"x", mode=0o6755)
        .special("dev/sda", tarfile.BLKTYPE)
        .special("fifo", tarfile.FIFOTYPE)
        .link("up", "../../../../etc")
    )
    images.write_oci_layout(tmp_path / "layout", [layer.tar()])
    image, _ = import_image(store, tmp_path / "layout", name="neutral")
    root = store.layer_path(image.layers[0])
    assert (root / "abs").read_bytes() == b"x"
    assert oct((root / "suid").stat().st_mode & 0o7777) == oct(0o755)
    assert not (root / "dev" / "sda").exists()
    assert not (root / "fifo").exists()
    assert os.readlink(root / "up") == "../../../../etc"  # kept; resolved in the sandbox's own root
    assert (root / "abs").stat().st_uid == os.getuid()


def test_a_gzip_bomb_and_too_many_entries_are_refused(store: ImageStore, tmp_path: Path) -> None:
    bomb = Layer().file("zeros", bytes(80 << 20)).tar()
    images.write_oci_layout(tmp_path / "bomb", [bomb])
    assert sum(f.stat().st_size for f in (tmp_path / "bomb").rglob("*")) < 1 << 20
    with pytest.raises(ResourceExhaustedError, match=r"local.image_store_size"):
        import_image(store, tmp_path / "bomb", name="bomb")
    assert_empty(store)
    many = Layer()
    for n in range(50):
        many.file(f"f{n}")
    images.write_oci_layout(tmp_path / "many", [many.tar()])
    with pytest.raises(InvalidArgumentError, match=r"more than 20 entries"):
        import_image(store, tmp_path / "many", name="many", max_entries=20)
    assert_empty(store)


def test_the_store_bound_refuses_an_import_before_it_starts(tmp_path: Path, base: bytes) -> None:
    small = ImageStore(tmp_path / "small", max_bytes=1000)
    small.open()
    images.write_oci_layout(tmp_path / "layout", [base], compress=False)
    with pytest.raises(ResourceExhaustedError, match=r"needs \d+ more bytes.*local.image_store_size"):
        import_image(small, tmp_path / "layout", name="big")
    assert_empty(small)


def test_concurrent_imports_of_one_image_store_one_copy(store: ImageStore, base: bytes, tmp_path: Path) -> None:
    images.write_oci_layout(tmp_path / "layout", [base])
    errors: list[BaseException] = []

    def run(tag: str) -> None:
        try:
            import_image(store, tmp_path / "layout", name=tag)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"same:{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    index = store.index()
    assert (len(index.images), len(index.layers), len(index.tags)) == (1, 1, 4)
    assert len(list((store.root / "layers" / "sha256").iterdir())) == 1
    assert list((store.root / "staging").iterdir()) == []


def test_remove_and_prune_keep_shared_layers(store: ImageStore, base: bytes, tmp_path: Path) -> None:
    images.write_oci_layout(tmp_path / "one", [base])
    images.write_oci_layout(tmp_path / "two", [base, Layer().file("two").tar()])
    import_image(store, tmp_path / "one", name="one")
    two, _ = import_image(store, tmp_path / "two", name="two")
    assert store.remove("one:latest").layers == 0  # its layer is two's bottom layer too
    assert store.resolve(two.digest).digest == two.digest
    import_image(store, tmp_path / "one", name="two")  # the tag moves: the old image is untagged
    pruned = store.prune()
    assert pruned.images == (two.digest,)
    assert pruned.layers == 1
    with pytest.raises(NotFoundError, match=r"warmshell image import"):
        store.resolve("one")
    store.remove("two")
    assert_empty(store)


def test_a_restart_removes_what_no_image_owns(store: ImageStore, tmp_path: Path) -> None:
    (store.root / "staging" / "import-dead").mkdir()
    (store.root / "staging" / "import-dead" / "f").write_bytes(b"x")
    orphan = store.root / "layers" / "sha256" / ("e" * 64)
    orphan.mkdir()
    index = json.loads((store.root / "index.json").read_text())
    reopened = ImageStore(store.root, max_bytes=store.max_bytes)
    reopened.open()
    assert not orphan.exists()
    assert list((store.root / "staging").iterdir()) == []
    assert json.loads((store.root / "index.json").read_text()) == index
    shutil.rmtree(store.root)


def test_a_layer_is_never_stored_under_a_diff_id_it_does_not_hash_to(
    store: ImageStore, base: bytes, tmp_path: Path
) -> None:
    # The store shares layers by diff id: a config naming another layer's diff id for its own
    # bytes would otherwise plant those bytes in every image that uses the real layer.
    images.write_oci_layout(tmp_path / "real", [base], compress=False)
    import_image(store, tmp_path / "real", name="real")
    evil = Layer().file("etc/passwd", b"planted").tar()
    config = images.config_json([base])  # diff id of `base`, bytes of `evil`
    for compress in (False, True):
        layout = tmp_path / f"evil-{compress}"
        images.write_oci_layout(layout, [evil], compress=compress, config=config)
        with pytest.raises(InvalidArgumentError, match=r"diff id|has digest"):
            import_image(store, layout, name="evil")
    assert sorted(store.index().tags) == ["real:latest"]


def test_opening_the_store_again_leaves_imports_in_flight_alone(store: ImageStore) -> None:
    # A second gateway sharing local.image_dir opens the same store while this one imports.
    busy = store.new_staging()
    (busy / "layer").mkdir()
    ImageStore(store.root, max_bytes=store.max_bytes).open()
    assert (busy / "layer").is_dir()
    store.drop_staging(busy)
    assert not busy.exists()
