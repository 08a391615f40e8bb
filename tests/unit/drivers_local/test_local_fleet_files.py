"""Removing an ended instance's directory: the fast path for a directory holding its log alone,
and the whole tree otherwise."""

from __future__ import annotations

from pathlib import Path

from warmshell.drivers.local.fleet import _remove_dir
from warmshell.drivers.local.instances import LOG_NAME


def test_a_directory_with_its_log_alone_is_removed(tmp_path: Path) -> None:
    directory = tmp_path / "li-1"
    directory.mkdir()
    (directory / LOG_NAME).write_text("bwrap: ...\n")
    _remove_dir(directory, LOG_NAME)
    assert not directory.exists()


def test_a_directory_with_more_in_it_is_removed_as_a_tree(tmp_path: Path) -> None:
    directory = tmp_path / "li-2"
    (directory / "workspace" / "deep").mkdir(parents=True)
    (directory / "workspace" / "deep" / "file").write_text("x")
    (directory / LOG_NAME).write_text("")
    _remove_dir(directory, LOG_NAME)
    assert not directory.exists()
    _remove_dir(tmp_path / "li-3")  # a workspace on the host's disk, with no log
    (tmp_path / "li-3" / "a").mkdir(parents=True)
    _remove_dir(tmp_path / "li-3")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_directory_or_log_is_fine(tmp_path: Path) -> None:
    _remove_dir(tmp_path / "gone", LOG_NAME)
    (tmp_path / "empty").mkdir()
    _remove_dir(tmp_path / "empty", LOG_NAME)
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_named_like_the_log_is_unlinked_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep")
    directory = tmp_path / "li-4"
    directory.mkdir()
    (directory / LOG_NAME).symlink_to(outside)
    _remove_dir(directory, LOG_NAME)
    assert not directory.exists()
    assert outside.read_text() == "keep"
