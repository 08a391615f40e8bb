"""A real Debian root (mmdebstrap, cached per machine: tests/helpers/debian.py) imported as a
docker save tarball: every file there, hard links kept, setuid bits and device nodes gone, and a
second import of the same root stores nothing more."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

from tests.helpers import debian
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore


def test_a_debian_root_imports(tmp_path: Path) -> None:
    rootfs = debian.debian_rootfs_tar()
    debian.write_debian_docker_save(tmp_path / "debian.tar", rootfs, tag="debian:bookworm")
    store = ImageStore(tmp_path / "store", max_bytes=4 << 30)
    store.open()
    image, tags = import_image(store, tmp_path / "debian.tar")
    assert tags == ["debian:bookworm"]
    root = store.layer_path(image.layers[0])
    with tarfile.open(rootfs) as tar:
        members = tar.getmembers()
    regular = [m for m in members if m.isreg()]
    assert all((root / m.name).is_file() for m in regular)
    setuid = [m for m in regular if m.mode & stat.S_ISUID]
    assert setuid  # su, passwd, mount...: the archive has them
    assert not any((root / m.name).stat().st_mode & (stat.S_ISUID | stat.S_ISGID) for m in setuid)
    assert not any(stat.S_ISCHR(p.lstat().st_mode) or stat.S_ISBLK(p.lstat().st_mode) for p in (root / "dev").iterdir())
    hard = [m for m in members if m.islnk()]
    assert all(os.path.samefile(root / m.name, root / m.linkname) for m in hard)
    assert (root / "etc" / "debian_version").read_text().startswith("12")
    assert os.readlink(root / "bin") == "usr/bin"
    before = store.usage()
    import_image(store, tmp_path / "debian.tar", name="debian:again")
    assert store.usage() == before
