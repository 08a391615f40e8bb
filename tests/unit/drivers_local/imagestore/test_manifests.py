"""Reading an image's JSON and choosing a platform: bad JSON is refused naming where it is."""

from __future__ import annotations

import json

import pytest

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore import manifests
from warmshell.drivers.local.imagestore.manifests import Descriptor, Platform

M = "application/vnd.oci.image.manifest.v1+json"


def _d(n: int, platform: Platform | None, media_type: str = M) -> Descriptor:
    return Descriptor(media_type, "sha256:" + f"{n:x}" * 64, 10, platform)


def test_the_host_platform_is_chosen_from_an_index() -> None:
    amd, arm = Platform("linux", "amd64"), Platform("linux", "arm64", "v8")
    offered = [_d(1, amd), _d(2, arm), _d(3, Platform("unknown", "unknown"))]
    assert manifests.select_manifest(offered, manifests.platform_for_machine("aarch64"), where="i").platform == arm
    assert (
        manifests.select_manifest(offered, manifests.parse_platform("linux/amd64", field="p"), where="i") == offered[0]
    )
    with pytest.raises(InvalidArgumentError, match=r"no image for linux/s390x.*linux/amd64, linux/arm64/v8"):
        manifests.select_manifest(offered, Platform("linux", "s390x"), where="i")


def test_an_index_of_attestations_only_has_no_image() -> None:
    with pytest.raises(InvalidArgumentError, match=r"lists no image manifest"):
        manifests.select_manifest([_d(1, Platform("unknown", "unknown"))], None, where="index.json")


@pytest.mark.parametrize("text", ["linux", "linux/", "/amd64", "a/b/c/d"])
def test_bad_platforms_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"--platform"):
        manifests.parse_platform(text, field="--platform")


def test_a_config_that_is_not_json_names_its_file() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        manifests.parse_config(b"{not json", where="blobs/sha256/ab (sha256:ab)")
    assert caught.value.field == "blobs/sha256/ab (sha256:ab)"
    assert "not JSON" in caught.value.rule


def test_a_config_gives_the_runtime_settings() -> None:
    config = manifests.parse_config(
        json.dumps(
            {
                "os": "linux",
                "architecture": "amd64",
                "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "b" * 64]},
                "config": {"Env": ["A=1"], "Cmd": ["sh"], "WorkingDir": "/w", "User": "1000", "Labels": {"k": "v"}},
            }
        ).encode(),
        where="c",
    )
    assert (config.env, config.cmd, config.working_dir, config.user, config.labels) == (
        ("A=1",),
        ("sh",),
        "/w",
        "1000",
        {"k": "v"},
    )


def test_unknown_layer_media_types_are_refused_by_name() -> None:
    manifest = {
        "schemaVersion": 2,
        "mediaType": M,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "c" * 64, "size": 2},
        "layers": [{"mediaType": "application/x-foreign", "digest": "sha256:" + "d" * 64, "size": 1}],
    }
    with pytest.raises(InvalidArgumentError, match=r"unknown layer media type 'application/x-foreign'"):
        manifests.parse_manifest(json.dumps(manifest).encode(), where="m")
