"""Reading the JSON of an image: OCI index, OCI (or Docker v2) manifest, image config, and the
`manifest.json` of a `docker save` tarball; choosing one platform from a multi-platform index.

Pure: bytes in, typed values out. Every failure is an InvalidArgumentError whose field names the
file (and its digest) and whose rule says what is wrong, so an import's error points at the blob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore.references import check_digest

__all__ = [
    "Descriptor",
    "DockerEntry",
    "ImageConfig",
    "Manifest",
    "Platform",
    "layer_compression",
    "parse_config",
    "parse_docker_manifest",
    "parse_index",
    "parse_json",
    "parse_manifest",
    "parse_platform",
    "platform_for_machine",
    "select_manifest",
]

INDEX_TYPES = frozenset(
    {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
)
MANIFEST_TYPES = frozenset(
    {"application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"}
)
CONFIG_TYPES = frozenset({"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"})
_LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar": "tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd": "zstd",
}
# uname -m -> the OCI architecture (and variant) names.
_MACHINES = {
    "x86_64": ("amd64", ""),
    "amd64": ("amd64", ""),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "i686": ("386", ""),
    "i386": ("386", ""),
    "ppc64le": ("ppc64le", ""),
    "s390x": ("s390x", ""),
    "riscv64": ("riscv64", ""),
}


@dataclass(frozen=True)
class Platform:
    """An OCI platform: `os`/`architecture`[/`variant`]."""

    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what a blob is, its digest and size, and (in an index) its platform."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    """One image's manifest: its config blob and its layers, bottom first."""

    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image config warmshell uses (the runtime config and the layer diff ids)."""

    os: str
    architecture: str
    created: str
    diff_ids: tuple[str, ...]
    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DockerEntry:
    """One image of a `docker save` tarball's manifest.json (paths inside the tarball)."""

    config: str
    layers: tuple[str, ...]
    repo_tags: tuple[str, ...]


def parse_json(data: bytes, *, where: str) -> dict[str, Any]:
    """A JSON object, or InvalidArgumentError naming `where`."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(where, f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(where, f"not a JSON object (a {type(value).__name__})")
    return value


def _str(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = obj.get(key, None if required else "")
    if not isinstance(value, str):
        raise InvalidArgumentError(where, f"{key!r} must be a string")
    return value


def _strings(value: Any, key: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(where, f"{key!r} must be a list of strings")
    return tuple(value)


def _descriptor(obj: Any, where: str) -> Descriptor:
    if not isinstance(obj, dict):
        raise InvalidArgumentError(where, "a descriptor must be a JSON object")
    size = obj.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidArgumentError(where, "a descriptor's 'size' must be a non-negative integer")
    platform = obj.get("platform")
    annotations = obj.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise InvalidArgumentError(where, "'annotations' must be an object")
    return Descriptor(
        media_type=_str(obj, "mediaType", where, required=False),
        digest=check_digest(_str(obj, "digest", where), field=where),
        size=size,
        platform=_platform(platform, where) if platform is not None else None,
        annotations={str(k): str(v) for k, v in annotations.items()},
    )


def _platform(obj: Any, where: str) -> Platform:
    if not isinstance(obj, dict):
        raise InvalidArgumentError(where, "'platform' must be an object")
    return Platform(
        _str(obj, "os", where), _str(obj, "architecture", where), _str(obj, "variant", where, required=False)
    )


def parse_index(data: bytes, *, where: str) -> list[Descriptor]:
    """The manifests an OCI index (`index.json`, or a nested index blob) lists."""
    obj = parse_json(data, where=where)
    if obj.get("schemaVersion") != 2:
        raise InvalidArgumentError(where, "not an OCI index (schemaVersion must be 2)")
    manifests = obj.get("manifests")
    if not isinstance(manifests, list):
        raise InvalidArgumentError(where, "'manifests' must be a list")
    return [_descriptor(m, where) for m in manifests]


def parse_manifest(data: bytes, *, where: str) -> Manifest:
    """An image manifest (OCI, or Docker's schema 2 which has the same shape)."""
    obj = parse_json(data, where=where)
    media_type = obj.get("mediaType", "application/vnd.oci.image.manifest.v1+json")
    if obj.get("schemaVersion") != 2 or media_type not in MANIFEST_TYPES:
        raise InvalidArgumentError(where, f"not an image manifest (schemaVersion 2, mediaType {media_type!r})")
    layers = obj.get("layers")
    if not isinstance(layers, list):
        raise InvalidArgumentError(where, "'layers' must be a list")
    config = _descriptor(obj.get("config"), where)
    if config.media_type not in CONFIG_TYPES:
        raise InvalidArgumentError(where, f"unknown config media type {config.media_type!r}")
    parsed = tuple(_descriptor(layer, where) for layer in layers)
    for layer in parsed:
        layer_compression(layer.media_type, where=f"{where}: layer {layer.digest}")
    return Manifest(config=config, layers=parsed)


def parse_config(data: bytes, *, where: str) -> ImageConfig:
    """An image config: its platform, creation time, layer diff ids and runtime config."""
    obj = parse_json(data, where=where)
    rootfs = obj.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers":
        raise InvalidArgumentError(where, "'rootfs' must be an object of type 'layers'")
    diff_ids = _strings(rootfs.get("diff_ids"), "rootfs.diff_ids", where)
    for diff_id in diff_ids:
        check_digest(diff_id, field=f"{where}: rootfs.diff_ids")
    run = obj.get("config") or {}
    if not isinstance(run, dict):
        raise InvalidArgumentError(where, "'config' must be an object")
    labels = run.get("Labels") or {}
    if not isinstance(labels, dict):
        raise InvalidArgumentError(where, "'config.Labels' must be an object")
    return ImageConfig(
        os=_str(obj, "os", where, required=False),
        architecture=_str(obj, "architecture", where, required=False),
        created=_str(obj, "created", where, required=False),
        diff_ids=diff_ids,
        env=_strings(run.get("Env"), "config.Env", where),
        entrypoint=_strings(run.get("Entrypoint"), "config.Entrypoint", where),
        cmd=_strings(run.get("Cmd"), "config.Cmd", where),
        working_dir=_str(run, "WorkingDir", where, required=False),
        user=_str(run, "User", where, required=False),
        labels={str(k): str(v) for k, v in labels.items()},
    )


def parse_docker_manifest(data: bytes, *, where: str) -> list[DockerEntry]:
    """The images a `docker save` tarball's manifest.json lists."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(where, f"not JSON ({exc})") from None
    if not isinstance(value, list) or not value:
        raise InvalidArgumentError(where, "must be a non-empty JSON list of images")
    entries = []
    for item in value:
        if not isinstance(item, dict):
            raise InvalidArgumentError(where, "each image must be a JSON object")
        entries.append(
            DockerEntry(
                config=_str(item, "Config", where),
                layers=_strings(item.get("Layers"), "Layers", where),
                repo_tags=_strings(item.get("RepoTags"), "RepoTags", where),
            )
        )
    return entries


def layer_compression(media_type: str, *, where: str) -> str:
    """ "tar", "gzip" or "zstd" for a layer media type; InvalidArgumentError for any other."""
    try:
        return _LAYER_TYPES[media_type]
    except KeyError:
        known = ", ".join(sorted(_LAYER_TYPES))
        raise InvalidArgumentError(where, f"unknown layer media type {media_type!r} (known: {known})") from None


def platform_for_machine(machine: str, system: str = "linux") -> Platform:
    """The OCI platform of a host whose `uname -m` is `machine`."""
    architecture, variant = _MACHINES.get(machine, (machine, ""))
    return Platform(system.lower(), architecture, variant)


def parse_platform(text: str, *, field: str) -> Platform:
    """`OS/ARCH[/VARIANT]`, e.g. linux/amd64 or linux/arm64/v8."""
    parts = text.split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise InvalidArgumentError(field, f"{text!r} is not a platform: OS/ARCH[/VARIANT], e.g. linux/amd64")
    return Platform(parts[0], parts[1], parts[2] if len(parts) == 3 else "")


def _matches(offered: Platform, wanted: Platform) -> bool:
    if (offered.os, offered.architecture) != (wanted.os, wanted.architecture):
        return False
    # An index that gives no variant serves every variant; arm64's only variant is v8.
    return not wanted.variant or not offered.variant or offered.variant == wanted.variant


def select_manifest(descriptors: list[Descriptor], wanted: Platform | None, *, where: str) -> Descriptor:
    """The one entry of an index to import: the only one, or the one for `wanted` (an entry with
    no platform matches any; attestation manifests, platform unknown/unknown, never do)."""
    candidates = [d for d in descriptors if d.media_type in MANIFEST_TYPES | INDEX_TYPES]
    candidates = [d for d in candidates if d.platform is None or d.platform.os != "unknown"]
    if not candidates:
        raise InvalidArgumentError(where, "lists no image manifest")
    if wanted is None:
        if len(candidates) == 1:
            return candidates[0]
        raise InvalidArgumentError(where, "lists several images: name a platform")
    chosen = [d for d in candidates if d.platform is None or _matches(d.platform, wanted)]
    if not chosen:
        offered = ", ".join(str(d.platform) for d in candidates if d.platform is not None)
        raise InvalidArgumentError(where, f"has no image for {wanted} (it has: {offered})")
    return chosen[0]
