"""`pip wheel .` on a copy of the repository: where a C compiler exists the wheel carries the
sandbox agent and `warmshell-launch` (built by setup.py's hook, executable), and where none does
it carries only their sources, and the local driver then names the missing binary and how to
build it — which works on the installed copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
AGENT = "warmshell/drivers/local/runtime/agent"
BINARIES = ("warmshell-agent", "warmshell-launch")
pytestmark = pytest.mark.slow


def _copy_without_binaries(tmp_path: Path) -> Path:
    """The files a wheel is built from, without the binaries a checkout has built in place (so
    only the hook can have put them in the wheel)."""
    tree = tmp_path / "repo"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", *BINARIES)
    shutil.copytree(REPO / "src", tree / "src", ignore=ignore)
    return tree


def _wheel(tree: Path, out: Path, **env: str) -> tuple[zipfile.ZipFile, str]:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(out), str(tree)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=110,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("warmshell-*.whl")
    return zipfile.ZipFile(wheel), built.stdout + built.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (scripts/bootstrap installs one)")
def test_a_wheel_built_with_a_compiler_carries_the_agent_binaries(tmp_path: Path) -> None:
    wheel, _ = _wheel(_copy_without_binaries(tmp_path), tmp_path / "wheels")
    entries = {info.filename: info for info in wheel.infolist()}
    for name in BINARIES:
        info = entries[f"{AGENT}/{name}"]
        assert info.file_size > 0
        assert (info.external_attr >> 16) & 0o111 == 0o111, f"{name} is not executable in the wheel"
        assert f"{AGENT}/{name}.c" in entries
    head = wheel.read(f"{AGENT}/warmshell-agent")[:4]
    assert head == b"\x7fELF"
    # kubesim's container set-up, compiled where it is first used (kubesim/kubelet/native.py).
    assert "kubesim/kubelet/containersetup.c" in entries


def test_without_a_compiler_the_wheel_says_so_and_the_installed_driver_names_the_missing_binary(
    tmp_path: Path,
) -> None:
    wheel, log = _wheel(_copy_without_binaries(tmp_path), tmp_path / "wheels", CC=str(tmp_path / "no-such-cc"))
    names = set(wheel.namelist())
    assert not {f"{AGENT}/{name}" for name in BINARIES} & names
    assert f"{AGENT}/warmshell-agent.c" in names
    assert "no C compiler: the wheel has no sandbox agent" in log
    # Installed (unpacked where this interpreter's dependencies are still found), the local
    # driver refuses to start naming the binary and how to build it...
    site = tmp_path / "site"
    wheel.extractall(site)
    probe = (
        "from warmshell.drivers.local.runtime import launching\n"
        "from warmshell.core.errors import FailedPreconditionError\n"
        f"assert launching.__file__.startswith({str(site)!r}), launching.__file__\n"
        "try:\n    launching.Launcher(bwrap='bwrap')\n"
        "except FailedPreconditionError as exc:\n    print(exc)\n"
        "else:\n    print('started')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*argv: str) -> str:
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    refused = run("-c", probe)
    assert f"{site}/{AGENT}/warmshell-agent' is missing or not executable" in refused
    assert "build it with python -m warmshell.drivers.local.runtime.agent.building" in refused
    if shutil.which("cc") is None:
        return
    # ...and the way it names works on the installed copy.
    built = run("-m", "warmshell.drivers.local.runtime.agent.building")
    assert built.split() == [f"{site}/{AGENT}/{name}" for name in BINARIES]
    assert run("-c", probe).strip() == "started"
