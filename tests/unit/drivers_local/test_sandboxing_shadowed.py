"""Host paths under directories the sandbox replaces must be bound back explicitly."""

from __future__ import annotations

from pathlib import Path

from warmshell.drivers.local import sandboxing


def test_paths_under_replaced_directories_are_shadowed() -> None:
    assert sandboxing.shadowed(Path("/tmp/ci/src"))
    assert sandboxing.shadowed(Path("/run/user/0/venv"))
    assert not sandboxing.shadowed(Path("/work/main/src"))
    assert not sandboxing.shadowed(Path("/usr/lib/python3"))
    assert not sandboxing.shadowed(Path("/"))
