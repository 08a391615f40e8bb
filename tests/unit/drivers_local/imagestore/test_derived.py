"""A snapshot's image record (`imagestore.derived`): its base's config and layers plus one layer,
or that layer alone when flattened; its digest names exactly what it holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.drivers.local.imagestore.derived import snapshot_record
from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.imagestore.records import ImageRecord

BASE = ImageRecord(
    digest="sha256:" + "b" * 64,
    config_digest="sha256:" + "c" * 64,
    config=ImageConfig("linux", "amd64", "", ("sha256:" + "1" * 64,), env=("A=1",), user="app"),
    layers=("sha256:" + "1" * 64,),
    platform="linux/amd64",
    imported_ms=1,
)
LAYER = "sha256:" + "2" * 64


def test_a_snapshot_is_its_base_plus_the_new_layer_and_says_where_it_came_from() -> None:
    image = snapshot_record(BASE, LAYER, flattened=False, source_sandbox="default/prep", now_ms=5)
    assert image.layers == (*BASE.layers, LAYER)
    assert image.config.diff_ids == image.layers
    assert (image.config.env, image.config.user) == (BASE.config.env, BASE.config.user)
    assert (image.source_sandbox, image.base_digest, image.workspace) == ("default/prep", BASE.digest, True)
    assert image.digest != BASE.digest
    assert image.config_digest != BASE.config_digest


def test_a_flattened_snapshot_is_one_layer() -> None:
    image = snapshot_record(BASE, LAYER, flattened=True, source_sandbox="default/prep", now_ms=5)
    assert (image.layers, image.base_digest) == ((LAYER,), BASE.digest)


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_the_digest_changes_with_the_layers_and_only_with_them(first: bytes, second: bytes) -> None:
    one = snapshot_record(BASE, "sha256:" + first.hex(), flattened=False, source_sandbox="a/b", now_ms=1)
    two = snapshot_record(BASE, "sha256:" + second.hex(), flattened=False, source_sandbox="c/d", now_ms=2)
    assert (one.digest == two.digest) == (first == second)


def test_a_layer_the_base_already_has_is_not_named_twice() -> None:
    image = snapshot_record(BASE, BASE.layers[0], flattened=False, source_sandbox="default/prep", now_ms=5)
    assert image.layers == BASE.layers
