"""Interactive execs against a workload on Kubernetes (kubesim) that tampers with its devpts: a
pod's supervisor opens a pseudo-terminal through the workload's root (`dev/pts/ptmx`, no link
followed, the result checked to be the multiplexer), so a workload that covers its `/dev/pts`
and plants a link, a FIFO or another device as `ptmx` gets a refused exec, never a terminal of
something else and never a hung supervisor; once the workload puts its devpts back, terminals
work again."""

from __future__ import annotations

import asyncio
import signal

import pytest

import warmshell
from tests.helpers.gateway import RunningGateway
from tests.integration.drivers_kubernetes.conftest import cluster, gw  # noqa: F401

pytestmark = pytest.mark.timeout(180)

# Each plants a `ptmx` in a tmpfs over the workload's /dev/pts (its own mount namespace: the
# agent's, where execs start and through whose root the supervisor looks).
PLANTS = {
    "a link to the multiplexer": "ln -s /dev/ptmx /dev/pts/ptmx",
    "a link that climbs": "ln -s ../../../../dev/ptmx /dev/pts/ptmx",
    "a FIFO": "mkfifo /dev/pts/ptmx",
    "another character device": "mknod /dev/pts/ptmx c 1 3",
}


async def run_ok(sb: warmshell.AsyncSandbox, script: str) -> None:
    ran = await sb.run(["sh", "-c", script])
    assert ran.exit_code == 0, (script, ran.stderr)


async def terminal_name(sb: warmshell.AsyncSandbox) -> bytes:
    async with await sb.pty(["tty"]) as shell:
        seen = b""
        async for event in shell:
            seen += event.stdout + event.stderr
        assert shell.exit_code == 0, seen
    return seen.strip()


async def test_a_planted_ptmx_is_refused(gw: RunningGateway) -> None:  # noqa: F811
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="ptmx", ready_timeout=60)
        try:
            assert (await terminal_name(sb)).startswith(b"/dev/pts/")
            for what, plant in PLANTS.items():
                await run_ok(sb, f"mount -t tmpfs none /dev/pts && {plant}")
                with pytest.raises(warmshell.FailedPrecondition) as refused:
                    await asyncio.wait_for(terminal_name(sb), 30)
                # ELOOP for a link (never followed), else the device check names what it is not.
                message = str(refused.value)
                assert "not the pseudo-terminal multiplexer" in message or "symbolic links" in message, (what, message)
                await run_ok(sb, "umount /dev/pts")
                assert (await terminal_name(sb)).startswith(b"/dev/pts/"), what
        finally:
            await sb.delete()


async def test_signals_reach_a_pty_command_in_a_pod(gw: RunningGateway) -> None:  # noqa: F811
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="ptysig", ready_timeout=60)
        try:
            async with await sb.pty(["sh", "-c", "echo up; exec sleep 100"]) as shell:
                seen = b""
                while b"up" not in seen:
                    event = await asyncio.wait_for(shell.recv(), 30)
                    assert event is not None, seen
                    seen += event.stdout
                await shell.signal(signal.SIGTERM)
                assert await asyncio.wait_for(shell.wait(), 30) == 128 + signal.SIGTERM
        finally:
            await sb.delete()
