"""The host runner (Kubernetes pods, unisolated mode) tells a missing workdir from a missing or
non-executable command, as a failure to start (never as text in the command's output)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.sandboxio.processes import NotStarted, StartFailure, WorkdirError, run_streaming


async def _sink(stderr: bool, data: bytes) -> None:
    return None


async def test_a_missing_workdir_raises_naming_it(tmp_path: Path) -> None:
    with pytest.raises(WorkdirError, match=f"workdir {tmp_path}/nope does not exist") as missing:
        await run_streaming(["true"], env={}, cwd=str(tmp_path / "nope"), sink=_sink)
    assert missing.value.failure is StartFailure.WORKDIR


async def test_a_missing_command_is_not_started_with_the_shells_status(tmp_path: Path) -> None:
    written: list[bytes] = []

    async def sink(stderr: bool, data: bytes) -> None:
        written.append(data)

    with pytest.raises(NotStarted, match="no-such-program-x: command not found") as missing:
        await run_streaming(["no-such-program-x"], env={"PATH": "/usr/bin"}, cwd=str(tmp_path), sink=sink)
    assert (missing.value.failure, missing.value.failure.value, written) == (StartFailure.COMMAND_NOT_FOUND, 127, [])


async def test_a_file_that_is_not_executable_is_not_started(tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(NotStarted, match="permission denied") as refused:
        await run_streaming([str(script)], env={}, cwd=str(tmp_path), sink=_sink)
    assert refused.value.failure is StartFailure.NOT_EXECUTABLE
