"""The kubelet's container processes: started off the event loop, reaped through a pidfd, exit
statuses as asyncio reports them, no thread held per running child, and a stop that ends a
process even before it leads its own process group (a fork server's child, stopped at once)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import subprocess
import threading

import pytest

from kubesim.kubelet import containers, forkserver, native


async def start(tmp_path: pathlib.Path, script: str) -> containers.HostProcess:
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    return await containers.start_process(["sh", "-c", script], env=env, cwd=tmp_path, log_path=tmp_path / "log")


async def test_exit_codes_signals_and_output(tmp_path: pathlib.Path) -> None:
    done = await start(tmp_path, "echo hello; exit 3")
    assert await asyncio.wait_for(done.wait(), 10) == 3
    assert done.returncode == 3
    assert (tmp_path / "log").read_text() == "hello\n"
    sleeper = await start(tmp_path, "exec sleep 60")
    assert sleeper.returncode is None
    assert os.getpgid(sleeper.pid) == sleeper.pid  # its own process group, for the kubelet's signals
    containers.signal_group(sleeper, signal.SIGKILL)
    assert await asyncio.wait_for(sleeper.wait(), 10) == -signal.SIGKILL


async def test_running_children_hold_no_thread_each(tmp_path: pathlib.Path) -> None:
    before = threading.active_count()
    sleepers = [await start(tmp_path, "exec sleep 60") for _ in range(12)]
    try:
        # The spawns ran on the default executor (a few threads); nothing waits per child.
        assert threading.active_count() - before < len(sleepers)
    finally:
        for proc in sleepers:
            await containers.stop_process(proc, 0)
    assert all(proc.returncode is not None for proc in sleepers)


async def test_a_start_cancelled_mid_spawn_leaves_no_process(tmp_path: pathlib.Path) -> None:
    def children() -> set[int]:
        # Children of any of this process's threads (the spawns run on worker threads).
        found = set()
        for entry in pathlib.Path("/proc").iterdir():
            try:
                if (
                    entry.name.isdigit()
                    and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
                ):
                    found.add(int(entry.name))
            except OSError:
                continue
        return found

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False

    before = children()
    for _ in range(5):
        task = asyncio.create_task(start(tmp_path, "exec sleep 60"))
        await asyncio.sleep(0)  # the spawn is on its thread now
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.sleep(0.2)  # the SIGKILLs land
    assert not [p for p in children() - before if alive(p)]


async def test_a_stop_ends_a_process_that_leads_no_process_group_yet() -> None:
    # As a fork server's child is between its fork (pid reported) and its setsid: in its
    # parent's process group, so a signal to the group its pid would name reaches nobody.
    popen = subprocess.Popen(["sleep", "60"])
    popen.returncode = 0  # HostProcess reaps it through its pidfd
    proc = containers.HostProcess(popen.pid)
    assert os.getpgid(proc.pid) != proc.pid
    await asyncio.wait_for(containers.stop_process(proc, 0), 10)
    assert proc.returncode in (-signal.SIGTERM, -signal.SIGKILL)


@pytest.mark.skipif(os.geteuid() != 0, reason="the fork server's containers need mount namespaces (root)")
async def test_containers_of_the_fork_server_stopped_as_soon_as_started_all_end(tmp_path: pathlib.Path) -> None:
    # A pod stopped right after its start (a pool's replacement pod at a cluster's teardown): on
    # a loaded host, most of these stops once waited forever (the signals went before setsid).
    (tmp_path / "mounts.json").write_text("{}")
    server = forkserver.ForkServer((), env={"PATH": os.environ.get("PATH", os.defpath)})
    try:
        for _ in range(20):
            proc = await server.spawn_exec(
                ["sleep", "60"],
                env={"PATH": os.environ.get("PATH", os.defpath)},
                cwd=tmp_path,
                log_path=tmp_path / "log",
                mounts=tmp_path / "mounts.json",
                mount_words=native.mount_words({}, tmp_path / "mounts.json"),
            )
            await asyncio.wait_for(containers.stop_process(proc, 0), 10)
            assert proc.returncode == forkserver.KILLED_WITH_SERVER  # 128 + SIGKILL, as the server reports it
    finally:
        await server.aclose()
