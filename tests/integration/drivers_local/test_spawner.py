"""The spawner threads: a start's blocking preparation does not hold up the next start, and the
launcher's first starts, prepared in several threads at once, stage the agent once."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

from warmshell.drivers.local.runtime.launching import Launcher
from warmshell.drivers.local.runtime.processes import Spawner


async def test_a_start_blocked_in_its_preparation_does_not_hold_up_the_next(tmp_path: Path) -> None:
    spawner = Spawner("test-spawn")
    both_preparing = threading.Barrier(2, timeout=5)  # broken (an error) unless both run at once

    def build() -> list[str]:
        both_preparing.wait()
        return ["/bin/true"]

    try:
        children = await asyncio.gather(
            spawner.start(build, log_path=tmp_path / "a.log", pass_fds=()),
            spawner.start(build, log_path=tmp_path / "b.log", pass_fds=()),
        )
        assert [await child.wait() for child in children] == [0, 0]
    finally:
        spawner.close()


async def test_one_thread_is_one_start_at_a_time(tmp_path: Path) -> None:
    spawner = Spawner("test-spawn", threads=1)
    both_preparing = threading.Barrier(2, timeout=0.5)

    def build() -> list[str]:
        both_preparing.wait()
        return ["/bin/true"]

    try:
        results = await asyncio.gather(  # both awaited: neither finishes after the test's loop closed
            spawner.start(build, log_path=tmp_path / "a.log", pass_fds=()),
            spawner.start(build, log_path=tmp_path / "b.log", pass_fds=()),
            return_exceptions=True,
        )
        assert [type(result) for result in results] == [threading.BrokenBarrierError] * 2
    finally:
        spawner.close()


def agent_digest(agent: Path) -> str:
    return hashlib.sha256(agent.read_bytes()).hexdigest()[:16]


def test_the_launcher_prepares_its_first_starts_once_from_several_threads(tmp_path: Path) -> None:
    agent, launch = tmp_path / "agent", tmp_path / "launch"
    for binary in (agent, launch):
        # Big enough that copying the agent into the stage takes a while: starts overlap in it.
        binary.write_bytes(b"#!/bin/sh\n" + b"#" * (16 << 20))
        binary.chmod(0o755)
    stage = tmp_path / "stage"
    stage.mkdir()
    launcher = Launcher(bwrap="/usr/bin/bwrap", agent=agent, launch=launch, stage_dir=stage, etc_dir=tmp_path / "etc")
    errors: list[BaseException] = []
    together = threading.Barrier(8, timeout=5)

    def prepare() -> None:
        together.wait()
        try:
            launcher.prepare("")
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=prepare) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    launcher.close()
    assert errors == []
    assert [p.name for p in stage.iterdir()] == [f"warmshell-agent-{agent_digest(agent)}"]  # no partial copy left


def test_the_first_start_on_a_new_host_makes_the_stage_directory(tmp_path: Path) -> None:
    # A root gateway stages the agent in local.sandbox_dir, which nothing else may have made yet
    # when the first sandbox has its workspace on a tmpfs (found on a fresh machine: every start
    # failed with ENOENT on the staged copy).
    agent, launch = tmp_path / "agent", tmp_path / "launch"
    for binary in (agent, launch):
        binary.write_bytes(b"#!/bin/sh\n")
        binary.chmod(0o755)
    stage = tmp_path / "new" / "sandboxes"
    launcher = Launcher(bwrap="/usr/bin/bwrap", agent=agent, launch=launch, stage_dir=stage, etc_dir=tmp_path / "etc")
    launcher.prepare("")
    launcher.close()
    assert stage.stat().st_mode & 0o777 == 0o711  # sandbox uids may reach the agent, not list it
    assert [p.name for p in stage.iterdir()] == [f"warmshell-agent-{agent_digest(agent)}"]
