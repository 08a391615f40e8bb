"""Layers captured from live trees (`imagestore.capture`): an overlayfs upper layer's deletions and
opaque directories become a layer's whiteouts, a plain tree is taken opaque under its prefix, and
whatever the tree holds passes the importer's rules (no setuid bit, no device node, links kept as
links, never followed)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from warmshell.core.errors import FailedPreconditionError, ResourceExhaustedError
from warmshell.drivers.local.imagestore.capture import REDIRECT_XATTR, Tree, capture_layer, tree_bytes
from warmshell.drivers.local.imagestore.extracting import OPAQUE_XATTR, WHITEOUT_XATTR

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


def capture(trees: list[tuple[Path, str, bool]], dest: Path, budget: int = 1 << 30) -> object:
    fds = [os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path, _, _ in trees]
    try:
        specs = [Tree(fd, prefix, upper) for fd, (_, prefix, upper) in zip(fds, trees, strict=True)]
        return capture_layer(specs, dest, budget=budget, where="the test's snapshot", max_entries=10_000)
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
    assert record.whiteouts == ("etc/gone",)  # type: ignore[attr-defined]
    assert record.digest.startswith("sha256:")  # type: ignore[attr-defined]


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
