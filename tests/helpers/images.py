"""Images built by the tests themselves (no registry is reachable): layer tars from given
entries or from host files, written out as an OCI image layout, an OCI archive, or a `docker
save` tarball."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

MARKER = "/etc/warmshell-test-marker"


@dataclass
class Layer:
    """A layer's entries (tarfile members with their data) in order."""

    members: list[tuple[tarfile.TarInfo, bytes]] = field(default_factory=list)

    def file(self, name: str, data: bytes = b"", mode: int = 0o644) -> Layer:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        self.members.append((info, data))
        return self

    def directory(self, name: str, mode: int = 0o755) -> Layer:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.members.append((info, b""))
        return self

    def link(self, name: str, target: str, *, hard: bool = False) -> Layer:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), target
        self.members.append((info, b""))
        return self

    def special(self, name: str, kind: bytes) -> Layer:
        info = tarfile.TarInfo(name)
        info.type = kind
        self.members.append((info, b""))
        return self

    def tar(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in self.members:
                tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
        return buffer.getvalue()


def host_shell_layer(marker: str = "built by the tests") -> Layer:
    """/bin/sh and the libraries it loads, copied from the host, and a marker file."""
    layer = Layer()
    shell = os.path.realpath("/bin/sh")
    paths = [shell]
    ldd = subprocess.run(["ldd", shell], capture_output=True, text=True, check=True).stdout
    paths += re.findall(r"(/\S+) \(0x", ldd)
    made: set[str] = set()
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            if directory not in made:
                made.add(directory)
                layer.directory(directory)
        layer.file(path.strip("/"), Path(path).read_bytes(), mode=0o755)
    if "bin" not in made:
        layer.directory("bin")
    if shell != "/bin/sh":
        layer.link("bin/sh", shell)
    layer.directory("etc")
    layer.file(MARKER.strip("/"), marker.encode())
    return layer


def slow_layers(count: int, *, files: int, file_bytes: int) -> list[bytes]:
    """A shell layer and `count` layers of random files: an import that takes long enough to be
    interrupted in the middle."""
    layers = [host_shell_layer().tar()]
    for n in range(count):
        layer = Layer()
        for f in range(files):
            layer.file(f"d{n}/f{f}", os.urandom(file_bytes))
        layers.append(layer.tar())
    return layers


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_json(layers: list[bytes], **runtime: object) -> bytes:
    return json.dumps(
        {
            "architecture": "amd64" if os.uname().machine == "x86_64" else "arm64",
            "os": "linux",
            "created": "2026-01-01T00:00:00Z",
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [sha256(layer) for layer in layers]},
        }
    ).encode()


def write_oci_layout(
    root: Path,
    layers: list[bytes],
    *,
    compress: bool = True,
    ref_name: str = "",
    config: bytes | None = None,
    layer_media_type: str = "",
    zstd: bool = False,
) -> str:
    """An OCI image layout of `layers` (uncompressed tars, gzipped unless `compress` is False);
    the manifest's digest."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes) -> dict[str, object]:
        (blobs / sha256(data).removeprefix("sha256:")).write_bytes(data)
        return {"digest": sha256(data), "size": len(data)}

    config = config if config is not None else config_json(layers, Env=["PATH=/usr/bin:/bin"], Cmd=["/bin/sh"])
    descriptors = []
    for layer in layers:
        data = gzip.compress(layer, mtime=0) if compress else layer
        media = layer_media_type or "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
        if zstd:
            data, media = zstandard.ZstdCompressor().compress(layer), "application/vnd.oci.image.layer.v1.tar+zstd"
        descriptors.append({"mediaType": media, **blob(data)})
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
            "layers": descriptors,
        }
    ).encode()
    entry: dict[str, object] = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **blob(manifest)}
    if ref_name:
        entry["annotations"] = {"io.containerd.image.name": ref_name}
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return sha256(manifest)


def write_docker_save(path: Path, layers: list[bytes], *, repo_tags: list[str] | None = None) -> None:
    """A `docker save` tarball (legacy layout: <id>/layer.tar, <config digest>.json)."""
    config = config_json(layers, Env=["PATH=/usr/bin:/bin"], Cmd=["/bin/sh"])
    config_name = sha256(config).removeprefix("sha256:") + ".json"
    names = [f"{sha256(layer).removeprefix('sha256:')}/layer.tar" for layer in layers]
    manifest = [{"Config": config_name, "RepoTags": repo_tags or [], "Layers": names}]
    with tarfile.open(path, "w") as tar:
        for name, data in [(config_name, config), *zip(names, layers, strict=True)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def tar_directory(root: Path, path: Path) -> None:
    """An OCI archive: the layout at `root` as a tar."""
    with tarfile.open(path, "w") as tar:
        for entry in sorted(root.rglob("*")):
            tar.add(entry, arcname=str(entry.relative_to(root)), recursive=False)
