"""A pod supervisor's memory stays flat while its gateway keeps GOAWAYing and dropping it.

A real `python -m warmshell supervisor` process against a stand-in gateway whose server GOAWAYs
every connection 1 ms after it is made and aborts every session after one heartbeat: the
supervisor goes through lost sessions and failed call attempts as fast as it reconnects. With
gRPC's own (transparent) retries on, a call started in that churn could be retried without end,
with no I/O, every attempt kept in the call's memory: the supervisor spun a core and grew by
~100 MB/s (the 300-620 MB pod supervisors seen under replica failover). The test compares the
growth over the second window with a bound, not the absolute size (load changes both the
reconnect rate and the baseline): a leak per attempt or a spinning retry grows it by hundreds
of MiB; a healthy supervisor by a few hundred KiB at most.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from tests.helpers.churning_gateway import ChurningGateway, free_port, memory_kib, serve, start_supervisor

pytestmark = pytest.mark.slow

WINDOW_SECONDS = 4.0
# Growth allowed over one window once the supervisor is warm (allocator slack, log buffers).
MAX_WINDOW_GROWTH_KIB = 16 * 1024
STARTUP_TIMEOUT_SECONDS = 60.0


async def test_memory_stays_flat_while_every_connection_is_goawayed(tmp_path: Path) -> None:
    gateway = ChurningGateway("abort")
    port = free_port()
    server = await serve(gateway, port, max_age_ms=1)
    supervisor = start_supervisor(port, tmp_path)
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_SECONDS):
            await gateway.session_started.wait()  # registered and activated: it is warm
        samples = []
        for _ in range(3):
            samples.append((gateway.sessions, memory_kib(supervisor.pid)["Private_Dirty"]))
            await asyncio.sleep(WINDOW_SECONDS)
        samples.append((gateway.sessions, memory_kib(supervisor.pid)["Private_Dirty"]))
        assert supervisor.poll() is None, f"the supervisor exited with {supervisor.returncode}"
    finally:
        supervisor.kill()
        supervisor.wait()
        await server.stop(None)
    # The churn did happen: sessions were lost and made again during the windows.
    assert samples[-1][0] > samples[0][0], samples
    growths = [later[1] - earlier[1] for earlier, later in itertools.pairwise(samples[1:])]
    assert max(growths) < MAX_WINDOW_GROWTH_KIB, f"(sessions, Private_Dirty KiB) samples: {samples}"
