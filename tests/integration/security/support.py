"""What the red team's attacks share: a ready sandbox, a shell command run in it as its workload
would run it, and the check that the sandbox still works for real afterwards."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

import grpc

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import sandbox_pb2 as pb


async def sandbox(gw: RunningGateway, name: str, spec: pb.SandboxSpec | None = None) -> pb.Sandbox:
    """Create `name` and wait until it is Ready."""
    await gw.create(name=name, spec=spec)
    ready = await gw.wait_ready(name)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
    return ready


async def sh(gw: RunningGateway, name: str, script: str, timeout: int = 0) -> tuple[int, str, str]:
    """Run `script` with /bin/sh in the sandbox: (exit code, stdout, stderr)."""
    code, out, err = await gw.exec(name, ["/bin/sh", "-c", script], timeout_seconds=timeout)
    return code, out.decode(), err.decode()


async def py(gw: RunningGateway, name: str, source: str, *args: str) -> tuple[int, str, str]:
    """Run a Python program in the sandbox (the host's python3, bound read-only)."""
    code, out, err = await gw.exec(name, ["python3", "-c", source, *args])
    return code, out.decode(), err.decode()


async def still_real(gw: RunningGateway, name: str) -> None:
    """The attack changed nothing: an exec still runs for real and says so."""
    assert await gw.exec(name, ["/bin/sh", "-c", "echo REAL; exit 7"]) == (7, b"REAL\n", b"")


class Attempts:
    """The calls a race test makes while the workload swaps names: what each ended with (OK or
    the status code), the results of those that succeeded, and any unclear failure (INTERNAL or
    UNKNOWN: a status a client cannot act on)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.results: dict[str, list[object]] = collections.defaultdict(list)
        self.unclear: list[str] = []

    async def attempt(self, label: str, call: Awaitable[object]) -> None:
        """Await `call` (bounded: none may hang on a FIFO) and record how it ended."""
        try:
            async with asyncio.timeout(self.timeout):
                result = await call
        except grpc.aio.AioRpcError as err:
            self.outcomes[f"{label}:{err.code().name}"] += 1
            if err.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
                self.unclear.append(f"{label}: {err.details()}")
            return
        self.outcomes[f"{label}:OK"] += 1
        self.results[label].append(result)

    def failures(self) -> int:
        """How many calls failed, whatever the status."""
        return sum(n for key, n in self.outcomes.items() if not key.endswith(":OK"))


async def wait_for(stat: Callable[[], Awaitable[object]], tries: int = 100) -> None:
    """Until `stat()` succeeds (the racer's files exist), or `tries` times 50 ms."""
    for _ in range(tries):
        try:
            await stat()
            return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.05)
