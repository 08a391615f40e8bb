"""`warmshell install-agent DIR`: a pod's init container copies the static agent for its workload."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from warmshell.drivers.local.runtime.agent import installing


def test_the_agent_is_copied_whole_and_executable(tmp_path: Path) -> None:
    source = tmp_path / "built"
    source.write_bytes(b"\x7fELF agent")
    (tmp_path / "out").mkdir()
    target = installing.install(tmp_path / "out", source=source)
    assert target == tmp_path / "out" / "warmshell-agent"
    assert target.read_bytes() == b"\x7fELF agent"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["warmshell-agent"]  # no partial file left


def test_usage_and_failures_are_exit_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert installing.main([]) == 2
    assert "usage: warmshell install-agent DIRECTORY" in capsys.readouterr().err
    assert installing.main([str(tmp_path / "missing")]) == 1
    assert "warmshell install-agent:" in capsys.readouterr().err
