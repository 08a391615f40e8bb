"""A workload that floods its output while nobody reads the supervisor's session: its real pipe
stops being read once the outbox's bound is queued (the process blocks in write, memory stays
bounded), and once a slow reader drains it every byte arrives, in order (checksum)."""

from __future__ import annotations

import asyncio
import hashlib
import sys

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.sandboxio.interactive import READ_CHUNK
from warmshell.sandboxio.processes import run_streaming
from warmshell.supervisor.outbox import Outbox

BOUND = 256 * 1024
BLOCKS = 320  # of 64 KiB: 20 MiB, 80 times the bound
WRITER = f"import sys\nfor i in range({BLOCKS}):\n    sys.stdout.buffer.write(i.to_bytes(4, 'big') * 16384)\n"
EXPECTED = hashlib.sha256(b"".join(i.to_bytes(4, "big") * 16384 for i in range(BLOCKS))).hexdigest()


async def test_a_flood_is_held_back_not_dropped() -> None:
    outbox = Outbox(max_bytes=BOUND)
    most_queued = 0

    async def sink(stderr: bool, data: bytes) -> None:
        nonlocal most_queued
        await outbox.put(spb.SupervisorMessage(output=spb.OutputData(stderr=stderr, data=data)))
        most_queued = max(most_queued, outbox.queued_bytes)

    async def workload() -> None:
        end = await run_streaming([sys.executable, "-c", WRITER], env={}, cwd="/", sink=sink)
        await outbox.put(spb.SupervisorMessage(workload_exited=spb.WorkloadExited(exit_code=end.exit_code)))

    task = asyncio.create_task(workload())
    await asyncio.sleep(1.0)  # nobody reads (a gateway away): the writer must be blocked
    assert not task.done()
    assert BOUND <= outbox.queued_bytes <= BOUND + READ_CHUNK

    digest, received, code = hashlib.sha256(), 0, None
    reader = outbox.stream(outbox.new_session(), spb.SupervisorMessage(hello=spb.SupervisorHello()))
    await anext(reader)
    async for message in reader:
        if message.WhichOneof("message") == "workload_exited":
            code = message.workload_exited.exit_code
            break
        digest.update(message.output.data)
        received += len(message.output.data)
        if received % (2 * 2**20) < READ_CHUNK:
            await asyncio.sleep(0.05)  # a slow reader now and then
    await task
    assert code == 0
    assert received == BLOCKS * 64 * 1024
    assert digest.hexdigest() == EXPECTED
    assert most_queued <= BOUND + READ_CHUNK
