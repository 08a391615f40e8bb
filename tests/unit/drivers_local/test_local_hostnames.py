"""Renaming sandboxes is best effort: a gateway that may not do it stops trying, once."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time

import pytest

from warmshell.drivers.local.runtime.hostnames import HostnameSetter


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


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
async def test_renames_another_uts_namespace_and_comes_back() -> None:
    own_namespace, own_name = os.readlink("/proc/thread-self/ns/uts"), os.uname().nodename
    child = subprocess.Popen(["unshare", "--uts", "sleep", "30"])  # unshare execs sleep: same pid
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{child.pid}/ns/uts") == own_namespace:
            assert time.monotonic() < deadline, "unshare did not enter a namespace of its own"
            time.sleep(0.01)
        setter = HostnameSetter()
        for name in ("first-name", "second-name"):  # the second reuses the namespace opened once
            await setter.set(child.pid, name)
            seen = subprocess.run(
                ["nsenter", "-t", str(child.pid), "-u", "hostname"], capture_output=True, text=True, check=True
            )
            assert seen.stdout.strip() == name
            assert os.readlink("/proc/thread-self/ns/uts") == own_namespace
            assert os.uname().nodename == own_name
    finally:
        child.kill()
        child.wait()
