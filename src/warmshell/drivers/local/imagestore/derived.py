"""The record of an image made from a sandbox (a snapshot): its base's config and layers plus the
captured layer, or that layer alone when the chain would pass `local.max_layers` (pure).

A snapshot has no manifest of its own to hash: its digest is that of the OCI manifest describing
its config and layers, as for a `docker save` tarball, so it names exactly what it holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from warmshell.drivers.local.imagestore.records import ImageRecord

__all__ = ["snapshot_record"]


def snapshot_record(base: ImageRecord, layer: str, *, flattened: bool, source_sandbox: str, now_ms: int) -> ImageRecord:
    """The image `base` plus `layer` on top (or `layer` alone, `flattened`), taken of `source_sandbox`.
    A layer the base already has (a sandbox that changed nothing since its own snapshot: the
    same tar, the same digest) is not named twice: overlayfs refuses a lower directory twice."""
    if flattened:
        layers: tuple[str, ...] = (layer,)
    else:
        layers = base.layers if layer in base.layers else (*base.layers, layer)
    config = dataclasses.replace(base.config, diff_ids=layers)
    config_json = json.dumps(dataclasses.asdict(config), sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config_json).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_json),
        },
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d} for d in layers],
    }
    digest = "sha256:" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return ImageRecord(
        digest=digest,
        config_digest=config_digest,
        config=config,
        layers=layers,
        platform=base.platform,
        imported_ms=now_ms,
        source_format="snapshot",
        source_sandbox=source_sandbox,
        base_digest=base.digest,
        workspace=True,
    )
