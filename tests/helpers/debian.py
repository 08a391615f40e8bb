"""A real Debian root filesystem, made with Debian's own tool (mmdebstrap, minbase variant, from
the apt mirror) once per machine and cached: ~170 MB, ~9,000 entries with hard links, symbolic
links, setuid binaries and device nodes, what an image of a real distribution holds. The first
build takes ~80 s (and needs the mirror); every later test reuses the tarball."""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.helpers.images import config_json

SUITE = "bookworm"


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "warmshell-tests"
    path.mkdir(parents=True, exist_ok=True)
    return path


def debian_rootfs_tar() -> Path:
    """The cached tarball of a minbase Debian root (built under a lock when missing)."""
    target = cache_dir() / f"debian-{SUITE}-minbase.tar"
    with open(cache_dir() / ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            assert shutil.which("mmdebstrap"), "mmdebstrap is required: scripts/bootstrap installs it (apt)"
            partial = target.with_suffix(".partial.tar")
            subprocess.run(
                ["mmdebstrap", "--quiet", "--variant=minbase", "--format=tar", SUITE, str(partial)],
                check=True,
                stdin=subprocess.DEVNULL,
                timeout=900,
            )
            partial.replace(target)
    return target


def write_debian_docker_save(path: Path, rootfs: Path, *, tag: str) -> None:
    """A one-layer `docker save` tarball of `rootfs` (the layer tar is the rootfs tar itself)."""
    import hashlib

    digest = hashlib.sha256()
    with rootfs.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    config = json.loads(config_json([], Cmd=["/bin/bash"]))
    config["rootfs"]["diff_ids"] = ["sha256:" + digest.hexdigest()]
    config_data = json.dumps(config).encode()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(path, "w") as tar:
        tar.add(rootfs, arcname="layer.tar")
        for name, data in (("config.json", config_data), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
