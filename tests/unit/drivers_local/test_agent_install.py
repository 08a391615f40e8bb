"""`warmshell install-agent DIR`: a pod's init container copies the static agent for its workload."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
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


def test_the_init_container_imports_nothing_of_the_driver(tmp_path: Path) -> None:
    # Every pod start runs it: importing the local driver with it cost ~0.35 s of CPU per pod.
    probe = (
        "import runpy, sys; sys.argv = ['warmshell', 'install-agent', sys.argv[1]]\n"
        "try:\n    runpy.run_module('warmshell', run_name='__main__')\nexcept SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('warmshell.drivers.local.driver', 'grpc')))\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "warmshell-agent").exists()


def _agent_install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(installing.BUILT_AGENT), "--install", *args], capture_output=True, text=True, check=False
    )


def test_the_agent_installs_itself_whole_and_executable(tmp_path: Path) -> None:
    """`warmshell-agent --install DIR`, the init container a pod of this version runs: the same
    copy as `warmshell install-agent`, whatever the umask, over an older one, no partial left."""
    (tmp_path / "warmshell-agent").write_bytes(b"an older agent")
    old_umask = os.umask(0o077)
    try:
        done = _agent_install(str(tmp_path))
    finally:
        os.umask(old_umask)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{tmp_path}/warmshell-agent\n", "")
    target = tmp_path / "warmshell-agent"
    assert target.read_bytes() == installing.BUILT_AGENT.read_bytes()
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warmshell-agent"]


def test_the_agents_install_reports_usage_and_failures(tmp_path: Path) -> None:
    for usage in ([], [str(tmp_path), "extra"]):
        done = _agent_install(*usage)
        assert (done.returncode, done.stderr) == (2, "usage: warmshell-agent --install DIRECTORY\n")
    missing = _agent_install(str(tmp_path / "missing"))
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"warmshell-agent --install: {tmp_path}/missing: ")
    too_long = _agent_install("x" * 5000)  # no path buffer overrun: refused before any copy
    assert too_long.returncode == 1
    assert "name too long" in too_long.stderr.lower()
    # A symlink planted at the partial file's name is not followed.
    (tmp_path / "elsewhere").write_bytes(b"kept")
    (tmp_path / ".warmshell-agent.tmp").symlink_to(tmp_path / "elsewhere")
    assert _agent_install(str(tmp_path)).returncode == 1
    assert (tmp_path / "elsewhere").read_bytes() == b"kept"
