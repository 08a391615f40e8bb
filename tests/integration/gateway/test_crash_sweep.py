"""kill -9 of the gateway during a burst of creates leaves nothing that nothing owns once it has
started again: no sandbox process, no instance directory or record, no workspace, and every
stored sandbox settles (lost: Error) and can be deleted (real gateway processes, real bwrap)."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.cli import start_gateway
from tests.helpers.gateway import own_sandbox_dir, running_gateway, runtime_dir_of
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.config import StatePaths

BURST = 6


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    with own_sandbox_dir("warmshell-sweep-") as directory:  # this test's own
        yield directory


def instance_ids(*directories: Path) -> set[str]:
    found: set[str] = set()
    for directory in directories:
        if directory.is_dir():
            found |= {p.name.removesuffix(".log") for p in directory.iterdir() if p.name.startswith("li-")}
    return found


def processes_of(ids: set[str]) -> list[int]:
    """Pids whose argv names one of these instances (bwrap's --setenv WARMSHELL_INSTANCE_ID)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(f"WARMSHELL_INSTANCE_ID\0{i}\0".encode() in argv for i in ids):
            pids.append(int(entry.name))
    return pids


async def burst_then_kill(state: Path, config: Path, seed: int) -> None:
    gateway = start_gateway(state, "--config", str(config))
    paths = StatePaths(state)
    token = paths.api_token.read_text().strip()
    metadata = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(f"unix://{paths.socket}") as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        calls = [
            asyncio.ensure_future(stub.CreateSandbox(pb.CreateSandboxRequest(name=f"b{i}"), metadata=metadata))
            for i in range(BURST)
        ]
        await asyncio.sleep(random.Random(seed).uniform(0.0, 0.6))
        gateway.process.send_signal(signal.SIGKILL)
        gateway.process.wait()
        await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_killed_gateway_leaves_nothing_unowned_after_restart(
    tmp_path: Path, sandbox_dir: Path, seed: int
) -> None:
    state = tmp_path / "state"
    config = tmp_path / "gateway.toml"
    config.write_text(f'[local]\nsandbox_dir = "{sandbox_dir}"\n')
    await burst_then_kill(state, config, seed)
    paths = StatePaths(state)
    runtime = runtime_dir_of(sandbox_dir)  # the egress directories, and the logs in its gw-*/
    left = instance_ids(paths.sandboxes, sandbox_dir, runtime, *runtime.glob("gw-*"))
    # What a kill between making an instance's directories and writing its record leaves (a
    # window of microseconds the random kills rarely hit): directories no record owns.
    unrecorded = "li-00000000deadbeef"
    (paths.sandboxes / unrecorded / "workspace").mkdir(parents=True)
    (sandbox_dir / unrecorded).mkdir(parents=True)
    async with running_gateway(state, **{"local.sandbox_dir": str(sandbox_dir)}) as gw:
        # --die-with-parent takes most sandboxes with their gateway, but a bwrap the kill caught
        # before it set its parent-death signal survives (seen under load): the start-up sweep
        # kills what is left of the old run's instances.
        assert processes_of(left) == []
        # The start-up sweep removed every instance directory, record, workspace and egress
        # directory of the old run.
        assert instance_ids(paths.sandboxes, sandbox_dir, runtime, *runtime.glob("gw-*"), paths.instances) == set()
        assert not paths.instances.exists() or list(paths.instances.iterdir()) == []
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        for sandbox in listed.sandboxes:  # each stored create settles (lost), and deletes
            settled = await gw.wait_for(sandbox.name, lambda s: s.status.phase == pb.SANDBOX_PHASE_ERROR, 15)
            assert settled.status.phase == pb.SANDBOX_PHASE_ERROR
            await gw.delete(sandbox.name)
        after = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        assert list(after.sandboxes) == []
        # And the restarted gateway works.
        await gw.create(name="after")
        assert (await gw.wait_ready("after")).status.phase == pb.SANDBOX_PHASE_READY


def processes_named(marker: str) -> list[int]:
    """Pids whose argv holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_daemon_the_workload_hid_does_not_outlive_a_killed_gateway(tmp_path: Path, sandbox_dir: Path) -> None:
    """Attack: a workload starts a daemon in a session of its own, with an empty environment (no
    trace of its sandbox) and deaf to TERM and HUP, hoping to outlive its gateway. It goes with its
    sandbox's pid namespace once the gateway is killed -9, and is not there after the restart."""
    state = tmp_path / "state"
    config = tmp_path / "gateway.toml"
    config.write_text(f'[local]\nsandbox_dir = "{sandbox_dir}"\n')
    marker = f"{random.randrange(10**6, 10**7)}.25"  # sleep's argument: this test's daemon alone
    gateway = start_gateway(state, "--config", str(config))
    assert gateway.run("sandbox", "create", "--name", "host").returncode == 0
    hide = f"trap '' TERM HUP; exec env -i sleep {marker}"
    started = gateway.run("sandbox", "exec", "host", "--", "setsid", "-f", "sh", "-c", hide)
    assert started.returncode == 0, started.stderr
    for _ in range(100):
        if processes_named(marker):
            break
        await asyncio.sleep(0.05)
    assert processes_named(marker), "the daemon never started"
    gateway.process.send_signal(signal.SIGKILL)
    gateway.process.wait()
    async with running_gateway(state, **{"local.sandbox_dir": str(sandbox_dir)}):
        for _ in range(40):  # a SIGKILLed namespace takes a moment to go
            if not processes_named(marker):
                break
            await asyncio.sleep(0.05)
        assert processes_named(marker) == []
