"""An import, from a source (OCI layout, OCI archive, `docker save` tarball) to a committed image:
read and check the JSON (`plan`), unpack each layer not yet stored while verifying its digests
(`_unpack`), and commit. Nothing reaches the store's index before every layer is complete, and
a failure leaves only a staging directory, deleted on the way out.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore import manifests, references, sources
from warmshell.drivers.local.imagestore.extracting import BoundedReader, Limits, extract_layer
from warmshell.drivers.local.imagestore.manifests import Descriptor, ImageConfig, Platform
from warmshell.drivers.local.imagestore.records import ImageRecord, LayerRecord
from warmshell.drivers.local.imagestore.sources import HashingReader, ReadableInto, Source, blob_path, read_small_blob
from warmshell.drivers.local.imagestore.store import SIZE_KEY, ImageStore, StagedLayer, now_ms

__all__ = ["ImagePlan", "LayerPlan", "Progress", "host_platform", "import_image", "plan"]

_NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")
_MAX_NESTING = 4


@dataclass(frozen=True)
class LayerPlan:
    """One layer to import: where its blob is, what it must hash to, how it is compressed."""

    path: str
    digest: str
    size: int | None
    compression: str
    diff_id: str


@dataclass(frozen=True)
class ImagePlan:
    """What a source holds for the chosen platform, checked except for the layers' bytes."""

    digest: str
    config_digest: str
    config: ImageConfig
    layers: tuple[LayerPlan, ...]
    names: tuple[str, ...]
    source_format: str


@dataclass(frozen=True)
class Progress:
    """Where an import is: `layers_done` of `layers`, `bytes_done` of `bytes_total` read."""

    layers_done: int
    layers: int
    bytes_done: int
    bytes_total: int


def host_platform() -> Platform:
    """This host's platform."""
    return manifests.platform_for_machine(platform.machine(), platform.system())


def plan(source: Source, wanted: Platform | None) -> ImagePlan:
    """Read a source's index or manifest.json and the chosen image's manifest and config."""
    if source.exists("index.json"):
        return _plan_oci(source, wanted)
    if source.exists("manifest.json"):
        return _plan_docker(source)
    raise InvalidArgumentError(
        source.name,
        "is neither an OCI image layout (oci-layout, index.json, blobs/) nor a docker save tarball (manifest.json)",
    )


def _where(source: Source, digest: str) -> str:
    return f"{source.name}: {blob_path(digest)} ({digest})"


def _plan_oci(source: Source, wanted: Platform | None) -> ImagePlan:
    index_where = f"{source.name}: index.json"
    descriptors = manifests.parse_index(
        read_small_blob(source, "index.json", digest=None, size=None, where=index_where), where=index_where
    )
    chosen = manifests.select_manifest(descriptors, wanted, where=index_where)
    names = [chosen.annotations[a] for a in _NAME_ANNOTATIONS if a in chosen.annotations]
    for _ in range(_MAX_NESTING):
        if chosen.media_type not in manifests.INDEX_TYPES:
            break
        where = _where(source, chosen.digest)
        data = _blob(source, chosen, where)
        chosen = manifests.select_manifest(manifests.parse_index(data, where=where), wanted, where=where)
    where = _where(source, chosen.digest)
    manifest = manifests.parse_manifest(_blob(source, chosen, where), where=where)
    config_where = _where(source, manifest.config.digest)
    config = manifests.parse_config(_blob(source, manifest.config, config_where), where=config_where)
    if len(config.diff_ids) != len(manifest.layers):
        raise InvalidArgumentError(
            config_where, f"lists {len(config.diff_ids)} diff ids for the manifest's {len(manifest.layers)} layers"
        )
    for layer in manifest.layers:
        if not source.exists(blob_path(layer.digest)):
            raise InvalidArgumentError(
                _where(source, layer.digest), "is named by the manifest but missing from the source"
            )
    layers = tuple(
        LayerPlan(blob_path(d.digest), d.digest, d.size, manifests.layer_compression(d.media_type, where=where), diff)
        for d, diff in zip(manifest.layers, config.diff_ids, strict=True)
    )
    return ImagePlan(chosen.digest, manifest.config.digest, config, layers, tuple(names), "oci")


def _blob(source: Source, descriptor: Descriptor, where: str) -> bytes:
    path = blob_path(descriptor.digest)
    if not source.exists(path):
        raise InvalidArgumentError(where, "is named by the image but missing from the source")
    return read_small_blob(source, path, digest=descriptor.digest, size=descriptor.size, where=where)


def _plan_docker(source: Source) -> ImagePlan:
    where = f"{source.name}: manifest.json"
    entries = manifests.parse_docker_manifest(
        read_small_blob(source, "manifest.json", digest=None, size=None, where=where), where=where
    )
    if len(entries) != 1:
        raise InvalidArgumentError(where, f"holds {len(entries)} images: save one image per tarball")
    entry = entries[0]
    config_where = f"{source.name}: {entry.config}"
    data = read_small_blob(source, entry.config, digest=None, size=None, where=config_where)
    config_digest = "sha256:" + hashlib.sha256(data).hexdigest()
    named = entry.config.rsplit("/", 1)[-1].removesuffix(".json")
    if len(named) == 64 and f"sha256:{named}" != config_digest:
        raise InvalidArgumentError(config_where, f"has digest {config_digest}, not the sha256:{named} it is named by")
    config = manifests.parse_config(data, where=config_where)
    if len(config.diff_ids) != len(entry.layers):
        raise InvalidArgumentError(
            config_where, f"lists {len(config.diff_ids)} diff ids for manifest.json's {len(entry.layers)} layers"
        )
    for path in entry.layers:
        if not source.exists(path):
            raise InvalidArgumentError(f"{source.name}: {path}", "is named by manifest.json but missing")
    layers = tuple(LayerPlan(p, d, None, "tar", d) for p, d in zip(entry.layers, config.diff_ids, strict=True))
    # A docker save tarball has no manifest blob: its digest is that of the OCI manifest that
    # describes the same config and layers, so the same image saved twice is stored once.
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(data)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d} for d in config.diff_ids],
    }
    digest = "sha256:" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return ImagePlan(digest, config_digest, config, layers, entry.repo_tags, "docker")


def _decompressed(reader: HashingReader, compression: str) -> ReadableInto | None:
    """The uncompressed stream of a compressed blob (None: the blob is an uncompressed tar)."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=cast(IO[bytes], reader), mode="rb")
    if compression == "zstd":
        import zstandard

        decompressor = zstandard.ZstdDecompressor()
        return cast(ReadableInto, decompressor.stream_reader(cast(IO[bytes], reader), read_across_frames=True))
    return None


def _tar_stream(blob: HashingReader, layer: LayerPlan) -> HashingReader:
    """The layer's tar, hashed against its diff id: a layer is stored (and shared) by its diff
    id, so a blob whose content is not what the config says must never be stored under it."""
    plain = _decompressed(blob, layer.compression)
    if plain is None:
        if layer.digest != layer.diff_id:
            raise InvalidArgumentError(
                blob.where, f"is an uncompressed layer whose config diff id is another digest, {layer.diff_id}"
            )
        return blob
    return HashingReader(plain, digest=layer.diff_id, size=None, where=f"{blob.where}, uncompressed")


def _unpack(source: Source, layer: LayerPlan, dest: Path, *, budget: int, max_entries: int) -> LayerRecord:
    """Unpack one layer into `dest`, checking its blob's digest and size and its diff id."""
    where = f"{source.name}: {layer.path} ({layer.digest})"
    with HashingReader(source.open(layer.path), digest=layer.digest, size=layer.size, where=where) as blob:
        tar_stream = _tar_stream(blob, layer)
        bounded = BoundedReader(tar_stream, limit=budget, key=SIZE_KEY, where=where)
        stats = extract_layer(bounded, dest, where=where, limits=Limits(budget=budget, max_entries=max_entries))
        blob.drain()
        blob.verify()
        tar_stream.verify()
    return LayerRecord(
        digest=layer.diff_id,
        size=bounded.count,
        entries=stats.entries,
        files=stats.files,
        whiteouts=tuple(stats.whiteouts),
        opaque=tuple(stats.opaque),
    )


def _verify_only(source: Source, layer: LayerPlan, *, limit: int) -> None:
    """Check a layer the store already has: its blob, and that it is the layer its diff id names."""
    where = f"{source.name}: {layer.path} ({layer.digest})"
    with HashingReader(source.open(layer.path), digest=layer.digest, size=layer.size, where=where) as blob:
        tar_stream = _tar_stream(blob, layer)
        BoundedReader(tar_stream, limit=limit, key=SIZE_KEY, where=where).drain()
        blob.drain()
        blob.verify()
        tar_stream.verify()


def import_image(
    store: ImageStore,
    source_path: Path,
    *,
    name: str = "",
    wanted: Platform | None = None,
    source_name: str = "",
    max_entries: int = 1_000_000,
    progress: Callable[[Progress], None] | None = None,
) -> tuple[ImageRecord, list[str]]:
    """Import the image at `source_path` (for `wanted`, else this host's platform when the source
    holds several), tagged `name` (else the tags the source gives); the record and its tags."""
    tags = [references.parse_tagged_name(name, field="name").tagged] if name else []
    source = sources.open_source(source_path, name=source_name)
    try:
        image_plan = plan(source, wanted or host_platform())
        if not tags:
            tags = _source_tags(image_plan.names)
        with store.staging() as stage:
            staged = _stage(store, source, stage, image_plan, max_entries, progress)
            return store.commit(_record(image_plan), staged, tags), tags
    finally:
        source.close()


def _stage(
    store: ImageStore,
    source: Source,
    stage: Path,
    image_plan: ImagePlan,
    max_entries: int,
    progress: Callable[[Progress], None] | None,
) -> list[StagedLayer]:
    index = store.index()
    todo = [layer for layer in image_plan.layers if layer.diff_id not in index.layers]
    store.check_room(sum(layer.size or 0 for layer in todo), what=f"image {image_plan.digest}")
    total = sum(layer.size or 0 for layer in image_plan.layers)
    staged: list[StagedLayer] = []
    done = 0
    for number, layer in enumerate(image_plan.layers):
        if layer.diff_id in index.layers or any(s.record.digest == layer.diff_id for s in staged):
            _verify_only(source, layer, limit=store.max_bytes)
        else:
            budget = store.max_bytes - index.usage() - sum(s.record.size for s in staged)
            dest = stage / layer.diff_id.removeprefix("sha256:")
            staged.append(StagedLayer(_unpack(source, layer, dest, budget=budget, max_entries=max_entries), dest))
        done += layer.size or 0
        if progress is not None:
            progress(Progress(number + 1, len(image_plan.layers), done, total))
    return staged


def _source_tags(names: tuple[str, ...]) -> list[str]:
    tags = []
    for name in names:
        try:
            tags.append(references.parse_tagged_name(name, field="name").tagged)
        except InvalidArgumentError:
            continue  # an annotation that is only a tag ("latest") names no image
    return tags


def _record(image_plan: ImagePlan) -> ImageRecord:
    config = image_plan.config
    return ImageRecord(
        digest=image_plan.digest,
        config_digest=image_plan.config_digest,
        config=config,
        layers=tuple(layer.diff_id for layer in image_plan.layers),
        platform=str(Platform(config.os, config.architecture)),
        imported_ms=now_ms(),
        source_format=image_plan.source_format,
    )
