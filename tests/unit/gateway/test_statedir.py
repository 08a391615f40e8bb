"""The state dir must be ours alone: refused otherwise with one line naming the path and the fix;
created 0700; what is created in it under umask 077."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from warmshell.core.errors import FailedPreconditionError
from warmshell.gateway.statedir import ensure_state_dir, private_umask, state_dir_problem

DIR = stat.S_IFDIR


def test_a_private_dir_of_ours_is_accepted() -> None:
    assert state_dir_problem(Path("/s"), mode=DIR | 0o700, owner=7, uid=7) is None
    assert state_dir_problem(Path("/s"), mode=DIR | 0o755, owner=7, uid=7) is None


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777, 0o720])
def test_a_group_or_world_writable_dir_is_refused(mode: int) -> None:
    problem = state_dir_problem(Path("/s/state"), mode=DIR | mode, owner=7, uid=7)
    assert problem is not None
    assert "/s/state" in problem
    assert f"{mode:04o}" in problem
    assert "fix: chmod 700 /s/state" in problem
    assert "\n" not in problem


def test_a_dir_of_another_uid_is_refused() -> None:
    problem = state_dir_problem(Path("/s/state"), mode=DIR | 0o700, owner=1000, uid=0)
    assert problem == ("state dir /s/state is owned by uid 1000, not by this gateway's uid 0; fix: chown 0 /s/state")


def test_a_file_is_not_a_state_dir() -> None:
    problem = state_dir_problem(Path("/s/state"), mode=stat.S_IFREG | 0o600, owner=7, uid=7)
    assert problem is not None
    assert "not a directory" in problem


def test_ensure_creates_the_dir_and_its_parents_0700(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state"
    ensure_state_dir(target)
    for path in (target, target.parent, target.parent.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_ensure_refuses_a_world_writable_dir(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.mkdir()
    target.chmod(0o777)
    with pytest.raises(FailedPreconditionError, match=r"group- or world-writable \(mode 0777\).*chmod 700"):
        ensure_state_dir(target)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a dir to another uid needs root")
def test_ensure_refuses_a_dir_owned_by_another_uid(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.mkdir(mode=0o700)
    os.chown(target, 4321, 4321)
    with pytest.raises(FailedPreconditionError, match="owned by uid 4321"):
        ensure_state_dir(target)


def test_the_private_umask_is_held_only_inside(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        with private_umask():
            (tmp_path / "inside").write_text("x")
        (tmp_path / "outside").write_text("x")
        assert stat.S_IMODE((tmp_path / "inside").stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "outside").stat().st_mode) == 0o644
    finally:
        os.umask(before)


def test_a_private_volume_is_not_checked(tmp_path: Path) -> None:
    """A Kubernetes emptyDir is 0777 by design; the chart says the volume is the pod's alone."""
    target = tmp_path / "state"
    target.mkdir()
    target.chmod(0o777)
    ensure_state_dir(target, private_volume=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o777
