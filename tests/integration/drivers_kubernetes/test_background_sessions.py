"""Background commands outlive their supervisor session on kubesim (real gateway, real pods): the
pod's supervisor keeps each command and its output ring, so a gateway restart (clean, or SIGKILL
of a gateway process) or a lost session that the supervisor reopens loses neither. The new
session re-adopts them under the same pids: the output written while no gateway was up is read
(within the ring, the rest counted as dropped), then stdin, a signal and the exit work as before."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import warmshell
from kubesim.cluster import RunningCluster
from tests.helpers.gateway import running_gateway
from tests.helpers.replicas import toml_text

from .conftest import driver_config, gateway_settings

pytestmark = pytest.mark.timeout(240)
HISTORY = 8192
# Output while no gateway is up: ticks, then more than the ring, then it waits for its stdin.
SCRIPT = (
    "for i in 1 2 3; do echo tick $i; done; sleep 1; head -c 20000 /dev/zero | tr '\\0' x; echo;"
    " echo waiting; read line; echo got $line; exit 7"
)
SLEEPER = ["sh", "-c", "echo up; exec sleep 600"]
WRITTEN = len(b"tick 1\ntick 2\ntick 3\n") + 20001 + len(b"waiting\n")


def settings(cluster: RunningCluster, state: Path) -> dict[str, object]:
    return {**gateway_settings(cluster, state), "exec_history_bytes": HISTORY, "heartbeat_interval_seconds": 1.0}


async def adopted(sb: warmshell.AsyncSandbox, pids: set[int], timeout: float = 60.0) -> list[warmshell.ProcessInfo]:
    """The sandbox's commands once the new session has re-adopted every pid in `pids`."""
    deadline = time.monotonic() + timeout
    while True:
        listed = await sb.processes()
        if {p.pid for p in listed} >= pids:
            return listed
        assert time.monotonic() < deadline, f"not re-adopted in {timeout}s: {listed}"
        await asyncio.sleep(0.1)


async def start_commands(client: warmshell.AsyncClient) -> tuple[int, int, int]:
    """In sandbox `bg`: the script above and a sleeper; in `other`: a sleeper. Their pids."""
    sb = await client.create(name="bg", ttl_seconds=600, ready_timeout=60)
    other = await client.create(name="other", ttl_seconds=600, ready_timeout=60)
    script = await sb.start(["sh", "-c", SCRIPT], background=True, open_stdin=True)
    await script.close()
    sleeper = await sb.start(SLEEPER, background=True)
    await sleeper.close()
    theirs = await other.start(SLEEPER, background=True)
    await theirs.close()
    assert (script.pid, sleeper.pid, theirs.pid) == (1, 2, 1)
    # StartProcess answers before the command starts in the pod: a gateway killed in between
    # would lose it, so the test's gateway goes only once every command has written.
    deadline = time.monotonic() + 30
    while True:
        listed = [*await sb.processes(), *await other.processes()]
        if all(p.output_bytes for p in listed):
            break
        assert time.monotonic() < deadline, f"the commands did not start: {listed}"
        await asyncio.sleep(0.05)
    return 1, 2, 1


async def check_readopted(client: warmshell.AsyncClient) -> None:
    """After the session changed: the same pids, the output kept while nobody followed, then
    stdin, a signal and the exits; pids go on from where they were; no pid crosses sandboxes."""
    sb, other = await client.get("bg"), await client.get("other")
    listed = await adopted(sb, {1, 2})
    assert [(p.pid, p.command) for p in listed] == [(1, ("sh", "-c", SCRIPT)), (2, tuple(SLEEPER))]
    async with await sb.connect(1) as attached:
        out, dropped = b"", 0
        async for event in attached:
            out, dropped = out + event.stdout, dropped + event.dropped_bytes
            if out.endswith(b"waiting\n"):
                break
        # Everything it wrote is accounted for: what the ring holds, and what it dropped.
        assert len(out) + dropped == WRITTEN
        assert dropped > 0
        assert len(out) <= HISTORY
        await attached.send("hi\n")
        rest = [event async for event in attached]
        assert b"".join(e.stdout for e in rest) == b"got hi\n"
        assert attached.exit_code == 7
    async with await sb.connect(2) as sleeper:
        await sleeper.signal(signal.SIGTERM)
        assert await asyncio.wait_for(sleeper.wait(), 30) == 128 + signal.SIGTERM
    ended = {p.pid: (p.state, p.exit_code) for p in await sb.processes()}
    assert ended == {1: ("exited", 7), 2: ("exited", 128 + signal.SIGTERM)}
    # Pids are never reused in a sandbox, whichever gateway hands them out.
    later = await sb.start(["true"], background=True)
    assert later.pid == 3
    await later.close()
    # The other sandbox's command is its own pid 1; this sandbox's pid 2 is not reachable there.
    assert [(p.pid, p.state) for p in await adopted(other, {1})] == [(1, "running")]
    with pytest.raises(warmshell.NotFound, match=r"pid: .*\b2\b"):
        async with await other.connect(2) as unknown:
            await unknown.wait()
    assert await sb.delete()
    assert await other.delete()


async def test_background_commands_survive_a_clean_gateway_restart(cluster: RunningCluster, tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_gateway(state, **settings(cluster, state)) as first:
        async with warmshell.AsyncClient(state_dir=state) as client:
            await start_commands(client)
        await first.stop()
    await asyncio.sleep(2)  # the script writes past its ring while no gateway is up
    async with (
        running_gateway(state, **settings(cluster, state)) as second,
        warmshell.AsyncClient(state_dir=state) as client,
    ):
        await check_readopted(client)
        assert not second.stopped


async def test_background_commands_survive_a_lost_session(cluster: RunningCluster, tmp_path: Path) -> None:
    """The same gateway: the session ends under the supervisor (as a network cut does), and the
    supervisor's next session carries the commands on; the gateway's copy of a ring is followed
    from where it was, not sent again."""
    state = tmp_path / "state"
    async with (
        running_gateway(state, **settings(cluster, state)) as gw,
        warmshell.AsyncClient(state_dir=state) as client,
    ):
        await start_commands(client)
        record = next(r for r in await gw.gateway.parts.records.list() if r.name == "bg")
        session = gw.gateway.parts.sessions.get(record.id)
        assert session is not None
        session.close("cut by the test", reconnect=True)
        await asyncio.sleep(2)
        await check_readopted(client)


@contextlib.asynccontextmanager
async def gateway_process(cluster: RunningCluster, state: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`warmshell gateway start` on kubesim in its own process (so it can be SIGKILLed), once it
    listens; stopped at the end if still running. It waits without blocking this loop, where
    kubesim's API server runs."""
    driver = driver_config(cluster, state).model_dump()
    election = driver.pop("leader_election")
    election.pop("identity")
    driver.pop("warm_pooling")
    top = {"state_dir": str(state), "driver": "kubernetes", "http_port": 0, "exec_history_bytes": HISTORY}
    top |= {"heartbeat_interval_seconds": 1.0, "reconcile_interval_seconds": 0.5}
    config = state.parent / "gateway.toml"
    config.write_text(toml_text({"": top, "kubernetes": driver, "kubernetes.leader_election": election}))
    (state / "gateway.json").unlink(missing_ok=True)
    log = (state.parent / "gateway.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "warmshell", "gateway", "start", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (state / "gateway.json").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((state.parent / "gateway.log").read_text())
            await asyncio.sleep(0.05)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(process.wait), 30)
            except TimeoutError:
                process.kill()
                process.wait()
        log.close()


async def test_background_commands_survive_a_gateway_killed_with_sigkill(
    cluster: RunningCluster, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    async with gateway_process(cluster, state) as first:
        async with warmshell.AsyncClient(state_dir=state) as client:
            await start_commands(client)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    await asyncio.sleep(2)
    async with gateway_process(cluster, state), warmshell.AsyncClient(state_dir=state) as client:
        await check_readopted(client)
