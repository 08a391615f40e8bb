"""Removing an ended instance's directory (most have none, or an empty one: one call) and finding
what a previous gateway left (its instances' logs and directories)."""

from __future__ import annotations

from pathlib import Path

from warmshell.core.ids import Fingerprint
from warmshell.drivers.local.fleet import _instances_on_disk, _remove_dir
from warmshell.drivers.local.instances import LOG_SUFFIX, Instance


def test_an_empty_directory_or_a_missing_one_is_removed_in_one_call(tmp_path: Path) -> None:
    (tmp_path / "li-1").mkdir()
    _remove_dir(tmp_path / "li-1")
    _remove_dir(tmp_path / "gone")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_with_a_workspace_in_it_is_removed_as_a_tree(tmp_path: Path) -> None:
    directory = tmp_path / "li-2"
    (directory / "workspace" / "deep").mkdir(parents=True)
    (directory / "workspace" / "deep" / "file").write_text("x")
    _remove_dir(directory)
    assert not directory.exists()


def test_a_symlink_planted_in_a_workspace_is_removed_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    workspace = tmp_path / "li-3" / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "link").symlink_to(outside)
    _remove_dir(tmp_path / "li-3")
    assert not (tmp_path / "li-3").exists()
    assert (outside / "keep").read_text() == "keep"


def test_an_instance_logs_beside_its_directory(tmp_path: Path) -> None:
    member = Instance.member("default", Fingerprint("f" * 64), "pool", sandboxes=tmp_path)
    assert member.log_path == tmp_path / f"{member.instance_id}{LOG_SUFFIX}"
    assert member.log_path.parent == member.directory.parent


def test_an_instance_given_a_directory_of_logs_logs_there(tmp_path: Path) -> None:
    member = Instance.member("default", Fingerprint("f" * 64), "pool", sandboxes=tmp_path / "sandboxes")
    member.logs = tmp_path / "runtime" / "gw-1"
    assert member.log_path == tmp_path / "runtime" / "gw-1" / f"{member.instance_id}{LOG_SUFFIX}"


def test_a_previous_gateways_instances_are_found_by_log_or_directory(tmp_path: Path) -> None:
    (tmp_path / f"li-00000000000000a1{LOG_SUFFIX}").write_text("")
    (tmp_path / "li-00000000000000a2").mkdir()
    (tmp_path / f"li-00000000000000a2{LOG_SUFFIX}").write_text("")
    (tmp_path / "not-an-instance").mkdir()
    assert _instances_on_disk(tmp_path) == {"li-00000000000000a1", "li-00000000000000a2"}
    assert _instances_on_disk(tmp_path / "missing") == set()
