"""Background commands on the Kubernetes driver (kubesim): the same exec over the pod's supervisor
session, so a command started by a client that goes away runs on in the pod, its output kept by
the gateway in a bounded ring, and another client lists it and reattaches (real gateway, real
pods started by the kubelet)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import warmshell
from kubesim.cluster import RunningCluster
from tests.helpers.gateway import RunningGateway, running_gateway

from .conftest import gateway_settings

HISTORY = 8192


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    """The Kubernetes gateway with a small ring, so that an overflow costs little output."""
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state), exec_history_bytes=HISTORY) as running:
        yield running


async def test_a_background_command_in_a_pod_is_listed_and_reattached(gw: RunningGateway) -> None:
    state = gw.gateway.config.state_dir
    async with warmshell.AsyncClient(state_dir=state) as first:
        sb = await first.create(name="bg", ttl_seconds=600, ready_timeout=60)
        # What it read is echoed before and after its 20 kB: the last line survives a reader that
        # falls behind the ring, so the stdin's delivery is checked whatever the reader lost.
        script = "echo started; read line; echo got $line; head -c 20000 /dev/zero | tr '\\0' x; echo; echo got $line"
        script += "; exit 5"
        process = await sb.start(["sh", "-c", script], background=True, open_stdin=True)
        assert (await process.recv()) == warmshell.OutputEvent(stdout=b"started\n")
        pid = process.pid
        assert pid is not None
    # The first client is gone; the command waits for its stdin in the pod.
    async with warmshell.AsyncClient(state_dir=state) as second:
        again = await second.get("bg")
        [info] = await again.processes()
        assert (info.pid, info.state, info.command[:2]) == (pid, "running", ("sh", "-c"))
        async with await again.connect(pid) as attached:
            assert (await attached.recv()) == warmshell.OutputEvent(stdout=b"started\n")
            await attached.send("hi\n")
            out, dropped = b"", 0
            after_attach = b"got hi\n" + b"x" * 20000 + b"\n" + b"got hi\n"
            async for event in attached:
                out, dropped = out + event.stdout, dropped + event.dropped_bytes
            assert attached.exit_code == 5
        # A reader never slows the command down: one that falls more than the ring behind it
        # loses the oldest bytes, and is told how many.
        # Under load it may lose the first line too: what it got is the stream with spans left out.
        produced = iter(after_attach)
        assert all(byte in produced for byte in out), out[:40]
        assert out.endswith(b"xxx\ngot hi\n")
        assert len(out) + dropped == len(after_attach)
        # Read again after its exit: the ring holds the last HISTORY bytes, and says what it dropped.
        async with await again.connect(pid) as late:
            events = [event async for event in late]
        total = 8 + len(after_attach)
        assert events[0].dropped_bytes == total - HISTORY
        assert b"".join(e.stdout for e in events) == (b"started\n" + after_attach)[-HISTORY:]
        [ended] = await again.processes()
        assert (ended.state, ended.exit_code, ended.output_bytes, ended.dropped_bytes) == (
            "exited",
            5,
            total,
            total - HISTORY,
        )
        with pytest.raises(warmshell.NotFound, match=r"pid: .*\b99\b"):
            async with await again.connect(99) as unknown:
                await unknown.wait()
        sleeper = await again.start(["sleep", "60"], background=True)
        await sleeper.close()  # detached: it runs on until a signal from whoever attaches
        async with await again.connect(sleeper.pid or 0) as attached:
            await attached.signal(signal.SIGTERM)
            assert await asyncio.wait_for(attached.wait(), 30) == 128 + signal.SIGTERM
        assert await again.delete() is True
