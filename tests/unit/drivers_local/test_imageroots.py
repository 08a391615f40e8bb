"""What an image of the store means to a sandbox, in pure parts: which references name one, and
the ids its `User` stands for inside the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore.manifests import ImageConfig
from warmshell.drivers.local.runtime.imageroots import ImageRoot, is_reference, user_ids


def test_references_are_neither_the_host_root_nor_a_path() -> None:
    assert [is_reference(i) for i in ("", "/srv/images/debian", "debian:12", "sha256:" + "a" * 64)] == [
        False,
        False,
        True,
        True,
    ]


def _layer(path: Path, passwd: str = "", group: str = "") -> Path:
    (path / "etc").mkdir(parents=True)
    if passwd:
        (path / "etc" / "passwd").write_text(passwd)
    if group:
        (path / "etc" / "group").write_text(group)
    return path


def test_a_user_is_numeric_or_named_in_the_images_own_files_top_layer_first(tmp_path: Path) -> None:
    bottom = _layer(tmp_path / "bottom", "root:x:0:0::/root:/bin/sh\napp:x:10:10::/:/bin/sh\n", "staff:x:50:\n")
    top = _layer(tmp_path / "top", "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")
    layers = (top, bottom)
    assert user_ids("", layers, field="spec.image") == (0, 0)
    assert user_ids("1234", layers, field="spec.image") == (1234, 1234)
    assert user_ids("1234:55", layers, field="spec.image") == (1234, 55)
    assert user_ids("app", layers, field="spec.image") == (1000, 1001)  # the top layer's passwd wins
    assert user_ids("app:staff", layers, field="spec.image") == (1000, 50)  # group only in the bottom one
    with pytest.raises(InvalidArgumentError) as caught:
        user_ids("nobody-here", layers, field="spec.image")
    assert caught.value.field == "spec.image"
    assert "/etc/passwd" in caught.value.rule


def test_the_image_env_is_a_mapping_a_later_entry_winning() -> None:
    config = ImageConfig(os="linux", architecture="amd64", created="", diff_ids=(), env=("A=1", "B=x=y", "A=2", "C"))
    root = ImageRoot(pinned="x:1@sha256:" + "a" * 64, digest="sha256:" + "a" * 64, layers=(), config=config)
    assert root.environment == {"A": "2", "B": "x=y"}
