"""Layers captured from live trees (`imagestore.capture`): an overlayfs upper layer's deletions and
opaque directories become a layer's whiteouts, a plain tree is taken opaque under its prefix, and
whatever the tree holds passes the importer's rules (no setuid bit, no device node, links kept as
links, never followed)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from warmshell.core.errors import FailedPreconditionError, ResourceExhaustedError
from warmshell.drivers.local.imagestore.capture import (
    REDIRECT_XATTR,
    Tree,
    _copy_across,
    _LiveFile,
    _TarBytes,
    capture_layer,
    tree_bytes,
)
from warmshell.drivers.local.imagestore.extracting import OPAQUE_XATTR, WHITEOUT_XATTR
from warmshell.drivers.local.imagestore.records import LayerRecord
from warmshell.drivers.local.imagestore.store import ImageStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="an overlayfs whiteout (a 0/0 device) needs root to make")


def _xattrs_work(path: Path) -> bool:
    probe = path / "probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if not _xattrs_work(tmp_path):
        pytest.skip("this filesystem keeps no user.* extended attributes")
    root = tmp_path / "tree"
    root.mkdir()
    return root


def capture(
    trees: list[tuple[Path, str, bool]], dest: Path, budget: int = 1 << 30, *, content: bool = True
) -> LayerRecord:
    fds = [os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path, _, _ in trees]
    try:
        specs = [Tree(fd, prefix, upper) for fd, (_, prefix, upper) in zip(fds, trees, strict=True)]
        return capture_layer(
            specs, dest, budget=budget, where="the test's snapshot", max_entries=10_000, content=content
        )
    finally:
        for fd in fds:
            os.close(fd)


@needs_root
def test_an_upper_layer_becomes_a_layer_with_whiteouts_and_opaque_directories(tree: Path, tmp_path: Path) -> None:
    (tree / "etc").mkdir()
    (tree / "etc" / "motd").write_text("hello")
    os.mknod(tree / "etc" / "gone", stat.S_IFCHR | 0o600, 0)  # overlayfs's record of a deletion
    (tree / "opt").mkdir()
    os.setxattr(tree / "opt", OPAQUE_XATTR, b"y")
    (tree / "opt" / "fresh").write_text("new")
    (tree / "bin").symlink_to("/usr/bin")
    (tree / "etc" / "hard").hardlink_to(tree / "etc" / "motd")
    dest = tmp_path / "layer"
    record = capture([(tree, "", True)], dest)
    assert (dest / "etc" / "motd").read_text() == "hello"
    assert os.getxattr(dest / "etc" / "gone", WHITEOUT_XATTR) == b""
    assert stat.S_ISREG(os.lstat(dest / "etc" / "gone").st_mode)
    assert os.getxattr(dest / "opt", OPAQUE_XATTR) == b"y"
    assert os.readlink(dest / "bin") == "/usr/bin"
    assert os.stat(dest / "etc" / "hard").st_ino == os.stat(dest / "etc" / "motd").st_ino
    assert record.whiteouts == ("etc/gone",)
    assert record.digest.startswith("sha256:")


def test_a_plain_tree_is_opaque_under_its_prefix_and_hostile_entries_are_tamed(tree: Path, tmp_path: Path) -> None:
    (tree / "tool").write_text("#!/bin/sh\n")
    os.chmod(tree / "tool", 0o4755)
    os.mkfifo(tree / "fifo")
    (tree / "escape").symlink_to("../../../../etc/shadow")
    os.setxattr(tree / "tool", WHITEOUT_XATTR, b"")  # a planted overlayfs marker means nothing in a plain tree
    dest = tmp_path / "layer"
    capture([(tree, "workspace", False)], dest)
    assert os.getxattr(dest / "workspace", OPAQUE_XATTR) == b"y"
    assert stat.S_IMODE(os.stat(dest / "workspace" / "tool").st_mode) == 0o755  # no setuid
    assert WHITEOUT_XATTR not in os.listxattr(dest / "workspace" / "tool")
    assert not (dest / "workspace" / "fifo").exists()
    assert os.readlink(dest / "workspace" / "escape") == "../../../../etc/shadow"  # kept, never followed


def test_a_redirected_directory_is_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "moved").mkdir()
    os.setxattr(tree / "moved", REDIRECT_XATTR, b"/elsewhere")
    with pytest.raises(FailedPreconditionError, match="renamed directory"):
        capture([(tree, "", True)], tmp_path / "layer")


def test_a_tree_past_the_budget_is_refused_and_a_sparse_file_counts_whole(tree: Path, tmp_path: Path) -> None:
    with open(tree / "sparse", "wb") as handle:
        handle.truncate(64 << 20)
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert tree_bytes([Tree(fd)]) == 64 << 20
    finally:
        os.close(fd)
    with pytest.raises(ResourceExhaustedError, match=r"local\.image_store_size"):
        capture([(tree, "workspace", False)], tmp_path / "layer", budget=1 << 20)


def _plain_tree(tree: Path) -> None:
    """Files of sizes on and off the tar's 512-byte blocks, an empty one, a hard link, a symbolic
    link, nested directories and a name that is not UTF-8."""
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "src" / "pkg" / "mod.py").write_bytes(os.urandom(70_001))
    (tree / "src" / "block").write_bytes(os.urandom(1024))
    (tree / "empty").write_bytes(b"")
    (tree / "src" / "twin").hardlink_to(tree / "src" / "block")
    (tree / "latest").symlink_to("src/pkg")
    (tree / os.fsdecode(b"caf\xe9")).write_text("latin-1 name")
    os.chmod(tree / "src" / "pkg" / "mod.py", 0o751)


def _tar_digest_of(tree: Path) -> str:
    """The sha256 of the tar Python's `tarfile` writes of the tree's entries (owner root, whole
    seconds), the archive an import of this layer would be checked against."""

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = int(info.mtime)
        return info

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(tree)):
            tar.add(tree / name, arcname=name, filter=as_root)
    return "sha256:" + hashlib.sha256(out.getvalue()).hexdigest()


def test_a_tagged_capture_is_named_by_the_digest_of_the_tar_of_its_content(tree: Path, tmp_path: Path) -> None:
    _plain_tree(tree)
    record = capture([(tree, "", True)], tmp_path / "layer")
    assert record.by_content
    assert record.digest == _tar_digest_of(tree)
    assert record.size % tarfile.RECORDSIZE == 0
    assert record.size > 70_001 + 1024 + 12
    again = capture([(tree, "", True)], tmp_path / "again")
    assert again.digest == record.digest  # the same content, the same layer (stored once)


def test_an_untagged_capture_copies_the_same_files_under_a_random_name(tree: Path, tmp_path: Path) -> None:
    _plain_tree(tree)
    hashed = capture([(tree, "", True)], tmp_path / "hashed")
    first = capture([(tree, "", True)], tmp_path / "first", content=False)
    second = capture([(tree, "", True)], tmp_path / "second", content=False)
    assert not first.by_content
    assert first.digest.startswith("sha256:")
    assert len({hashed.digest, first.digest, second.digest}) == 3
    assert (first.size, first.files) == (hashed.size, hashed.files)
    for path in (tmp_path / "hashed").rglob("*"):
        copied = tmp_path / "first" / path.relative_to(tmp_path / "hashed")
        assert os.lstat(copied).st_mode == os.lstat(path).st_mode, path
        if path.is_file() and not path.is_symlink():
            assert copied.read_bytes() == path.read_bytes(), path
    assert os.stat(tmp_path / "first" / "src" / "twin").st_ino == os.stat(tmp_path / "first" / "src" / "block").st_ino


def test_a_captured_file_is_a_copy_that_later_writes_to_the_tree_never_reach(tree: Path, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    (tree / "big").write_bytes(data)
    capture([(tree, "workspace", False)], tmp_path / "layer", content=False)
    with open(tree / "big", "r+b") as handle:  # written in place, as a sandbox after its fork would
        handle.write(b"later" * 1000)
    (tree / "big").unlink()
    assert (tmp_path / "layer" / "workspace" / "big").read_bytes() == data


def _copy_stated(source: Path, target: Path, stated: int) -> _TarBytes:
    """Copy `source` as an entry stated at `stated` bytes into a new file `target`."""
    tar = _TarBytes(content=False, budget=1 << 30, where="the test's snapshot")
    reading = os.open(source, os.O_RDONLY)
    writing = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        _LiveFile(reading, stated, tar).copy_to(writing)
    finally:
        os.close(reading)
        os.close(writing)
    return tar


def test_a_file_that_shrank_since_it_was_stated_is_padded_with_zeros_to_its_stated_size(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    (tmp_path / "source").write_bytes(data)
    stated = 3 << 20  # preallocated at that size, then one third written
    tar = _copy_stated(tmp_path / "source", tmp_path / "target", stated)
    assert (tmp_path / "target").read_bytes() == data + bytes(stated - len(data))
    assert tar.count == stated


def _another_filesystem(tmp_path: Path) -> Path:
    """A fresh directory on a filesystem other than `tmp_path`'s (a sandbox's tmpfs beside the
    store's disk), or skip."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no tmpfs at /dev/shm apart from the test's directory")
    path = shm / f"warmshell-capture-{os.getpid()}-{tmp_path.name}"
    path.mkdir()
    return path


@pytest.fixture
def tmpfs_tree(tmp_path: Path) -> Iterator[Path]:
    path = _another_filesystem(tmp_path)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _copied(source: Path, target: Path, offset: int, count: int) -> int:
    with open(source, "rb") as reading, open(target, "wb") as writing:
        return _copy_across(reading.fileno(), writing.fileno(), offset, count)


def test_a_file_from_another_filesystem_is_copied_whole_through_the_pipe(tmpfs_tree: Path, tmp_path: Path) -> None:
    data = os.urandom((5 << 20) + 12345)  # past the pipe several times, and not a multiple of it
    (tmpfs_tree / "big").write_bytes(data)
    capture([(tmpfs_tree, "workspace", False)], tmp_path / "layer", content=False)
    assert (tmp_path / "layer" / "workspace" / "big").read_bytes() == data
    assert _copied(tmpfs_tree / "big", tmp_path / "tail", 3 << 20, len(data)) == len(data) - (3 << 20)
    assert (tmp_path / "tail").read_bytes() == data[3 << 20 :]  # from an offset, up to the end


def test_a_file_that_shrank_is_padded_with_zeros_across_filesystems(tmpfs_tree: Path, tmp_path: Path) -> None:
    data = os.urandom((2 << 20) + 7)
    (tmpfs_tree / "source").write_bytes(data)
    stated = 4 << 20
    assert _copy_stated(tmpfs_tree / "source", tmp_path / "target", stated).count == stated
    assert (tmp_path / "target").read_bytes() == data + bytes(stated - len(data))


def test_a_pipe_the_kernel_will_not_enlarge_still_copies_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the user's quota of pipe pages the pipe keeps its default size (64 KiB)."""

    def refuse(fd: int, command: int, arg: int = 0) -> int:
        if command == fcntl.F_SETPIPE_SZ:
            raise OSError(errno.EPERM, "over the pipe quota")
        return 0

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    data = os.urandom((3 << 20) + 5)
    (tmp_path / "source").write_bytes(data)
    assert _copied(tmp_path / "source", tmp_path / "target", 0, len(data)) == len(data)
    assert (tmp_path / "target").read_bytes() == data


def test_the_room_for_a_capture_is_checked_beside_the_usage_it_is_given(tmp_path: Path) -> None:
    """A snapshot reads the store's usage once, before its sandbox is frozen, and checks its
    trees' bytes against that, not against a second read of the index while frozen."""
    store = ImageStore(tmp_path / "store", max_bytes=100)
    store.open()
    store.check_room(100, what="a capture", used=0)
    with pytest.raises(ResourceExhaustedError, match="needs 60 more bytes; the image store holds 50 of its 100"):
        store.check_room(60, what="a capture", used=50)
    with pytest.raises(ResourceExhaustedError, match="holds 0 of its 100"):
        store.check_room(101, what="a capture")  # the usage now: the empty store's
