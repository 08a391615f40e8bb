"""What the store's index holds about layers and images, and their JSON form (pure)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from warmshell.drivers.local.imagestore.manifests import ImageConfig

__all__ = ["ImageRecord", "Index", "LayerRecord"]


@dataclass(frozen=True)
class LayerRecord:
    """One unpacked layer, by its uncompressed digest (the config's diff id): `size` is its
    uncompressed tar's bytes, what it counts against the store's bound. `by_content` False: the
    layer of an untagged snapshot (a fork's, a pause's), named by a random digest instead of its
    content's (see `capture`): never shared with another layer, and no import can name it, as an
    import checks a layer's tar against its diff id even when the store holds that id."""

    digest: str
    size: int
    entries: int = 0
    files: int = 0
    whiteouts: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()
    by_content: bool = True
    # Set on a layer committed without syncing (a fork's, whose children die with the host): the
    # host boot its data is good for. Past a reboot it may be torn, so the first open of the store
    # in another boot removes every image naming it (`Index.unsynced_from_other_boots`); a
    # synced commit of an image naming it forces its data to disk first and clears this.
    boot_id: str = ""


@dataclass(frozen=True)
class ImageRecord:
    """One image by its manifest digest: its config and its layers, bottom first."""

    digest: str
    config_digest: str
    config: ImageConfig
    layers: tuple[str, ...]
    platform: str
    imported_ms: int
    source_format: str = "oci"
    # A snapshot's: the sandbox it was taken of (WORKSPACE/NAME) and the image it ran.
    source_sandbox: str = ""
    base_digest: str = ""
    # Whether its layers hold the sandbox's /workspace: a sandbox of it keeps that directory of
    # its root (under its own writable layer) instead of a fresh tmpfs.
    workspace: bool = False


@dataclass
class Index:
    """The whole index: tags (`name:tag` -> image digest), images and layers by digest."""

    tags: dict[str, str] = field(default_factory=dict)
    images: dict[str, ImageRecord] = field(default_factory=dict)
    layers: dict[str, LayerRecord] = field(default_factory=dict)

    def names_of(self, digest: str) -> list[str]:
        """The tags naming image `digest`, sorted."""
        return sorted(tag for tag, target in self.tags.items() if target == digest)

    def image_size(self, image: ImageRecord) -> int:
        """The bytes of an image's layers (shared layers counted in full)."""
        return sum(self.layers[d].size for d in image.layers if d in self.layers)

    def used_layers(self) -> set[str]:
        """The layers some image names."""
        return {d for image in self.images.values() for d in image.layers}

    def unsynced_from_other_boots(self, boot_id: str) -> list[str]:
        """The images naming a layer committed without syncing in a boot other than `boot_id`."""
        stale = {d for d, layer in self.layers.items() if layer.boot_id and layer.boot_id != boot_id}
        return sorted(d for d, image in self.images.items() if stale.intersection(image.layers))

    def usage(self) -> int:
        """The bytes of every stored layer, each once."""
        return sum(layer.size for layer in self.layers.values())

    def to_json(self) -> dict[str, Any]:
        """The index file's content."""
        return {
            "version": 1,
            "tags": dict(sorted(self.tags.items())),
            "images": {d: asdict(i) for d, i in sorted(self.images.items())},
            "layers": {d: _layer_json(layer) for d, layer in sorted(self.layers.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Index:
        """Read the index file's content back."""
        images = {}
        for digest, raw in data.get("images", {}).items():
            config = dict(raw["config"])
            for key in ("diff_ids", "env", "entrypoint", "cmd"):
                config[key] = tuple(config.get(key) or ())
            images[digest] = ImageRecord(**{**raw, "config": ImageConfig(**config), "layers": tuple(raw["layers"])})
        layers = {
            digest: LayerRecord(**{**raw, "whiteouts": tuple(raw["whiteouts"]), "opaque": tuple(raw["opaque"])})
            for digest, raw in data.get("layers", {}).items()
        }
        return cls(tags=dict(data.get("tags", {})), images=images, layers=layers)


def _layer_json(layer: LayerRecord) -> dict[str, Any]:
    """A layer's entry; `by_content` only when False and `boot_id` only when set, so a store
    holding no untagged snapshot stays readable by a gateway from before the fields."""
    raw = asdict(layer)
    if layer.by_content:
        del raw["by_content"]
    if not layer.boot_id:
        del raw["boot_id"]
    return raw
