"""A pod's supervisor keeps its memory flat whatever goes through it: an exec's output flood read
slowly, a large streamed stdin, a large file written and read back, the workload's own output
flood and execs that leave background children. Each goes through a bounded window or queue
(`outbox`, `window`, `fileops`); this measures the supervisor's peak resident set (VmHWM, read
from inside the pod: the supervisor is the pod's pid 1) against its idle size, so a buffer that
grows with the data moved fails here."""

from __future__ import annotations

import asyncio
import os

import warmshell
from tests.helpers.gateway import RunningGateway

MIB = 1024 * 1024
FLOOD = 96 * MIB  # each far beyond every window (4 MiB exec output, 1 MiB outbox, 1 MiB files)
GROWTH_LIMIT = 48 * MIB  # an idle supervisor is ~40 MiB; one unbounded buffer adds FLOOD


async def _peak_kib(sb: warmshell.AsyncSandbox) -> int:
    status = (await sb.run(["cat", "/proc/1/status"])).stdout.decode()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


async def test_the_pods_supervisor_stays_flat_under_floods(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="flood", command=["sh", "-c", f"head -c {FLOOD} /dev/zero; sleep 600"])
        try:
            idle = await _peak_kib(sb)
            received = 0
            async for event in sb.run_stream(["head", "-c", str(FLOOD), "/dev/zero"]):
                received += len(event.stdout)
                if received % (8 * MIB) < len(event.stdout):
                    await asyncio.sleep(0.2)  # a slow reader: the window fills and the command waits
            assert received == FLOOD
            chunk = os.urandom(MIB)
            counted = await sb.run(["wc", "-c"], stdin=[chunk] * (FLOOD // MIB), timeout=120)
            assert counted.stdout.strip() == str(FLOOD).encode()
            await sb.files.write("/workspace/big", chunk * 32)
            assert len(await sb.files.read("/workspace/big")) == 32 * MIB
            for _ in range(20):
                assert (await sb.run(["sh", "-c", "sleep 60 & echo $!"])).exit_code == 0
            peak = await _peak_kib(sb)
            assert (peak - idle) * 1024 < GROWTH_LIMIT, f"supervisor VmHWM {idle} KiB idle, {peak} KiB after the floods"
        finally:
            await sb.delete()
