"""Renaming sandboxes is best effort: a gateway that may not do it stops trying, once."""

from __future__ import annotations

import logging

import pytest

from warmshell.drivers.local.hostnames import HostnameSetter


async def test_gives_up_after_the_first_refusal(caplog: pytest.LogCaptureFixture) -> None:
    setter = HostnameSetter()
    calls: list[int] = []

    def refuse(pid: int, name: str) -> None:
        calls.append(pid)
        raise PermissionError(1, "Operation not permitted")

    setter._set_nowait = refuse  # type: ignore[method-assign]
    missing_pid = 2**22 + 12345  # above pid_max: nsenter cannot find it either
    with caplog.at_level(logging.WARNING):
        await setter.set(missing_pid, "demo")
        await setter.set(missing_pid, "demo")
    assert calls == [missing_pid], "no second attempt"
    warnings = [r for r in caplog.records if "keep their instance id" in r.getMessage()]
    assert len(warnings) == 1
