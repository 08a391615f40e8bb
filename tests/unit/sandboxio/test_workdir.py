"""The host runner (Kubernetes pods, unisolated mode) tells a missing workdir from a missing command."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.sandboxio.processes import WorkdirError, run_streaming


async def _sink(stderr: bool, data: bytes) -> None:
    return None


async def test_a_missing_workdir_raises_naming_it(tmp_path: Path) -> None:
    with pytest.raises(WorkdirError, match=f"workdir {tmp_path}/nope does not exist"):
        await run_streaming(["true"], env={}, cwd=str(tmp_path / "nope"), sink=_sink)


async def test_a_missing_command_is_127(tmp_path: Path) -> None:
    assert await run_streaming(["no-such-program-x"], env={"PATH": "/usr/bin"}, cwd=str(tmp_path), sink=_sink) == 127
