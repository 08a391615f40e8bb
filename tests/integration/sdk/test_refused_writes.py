"""A large write or upload over gRPC that the gateway refuses while the SDK's asyncio client is
still sending its chunks reaches the caller as the refusal itself (its code, and a message naming
the path and the rule), never as grpcio's INTERNAL "Internal error from Core": real gateway,
real bwrap'd sandbox, the SDK's `AsyncClient` with the byte stream off (so gRPC carries it)."""

from __future__ import annotations

import os
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.gateway import running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk.files import CHUNK_BYTES

pytestmark = [needs_bwrap]

LIMIT = 1024 * 1024
# Eight times the limit, sent in 256 KiB chunks: before the gateway answered only once the
# client had finished, one such write in four ended INTERNAL (grpc/grpc#36066); eight tries of
# each refusal, 32 in all, then miss that with a chance of about 1 in 10^4.
BIG = os.urandom(8 * LIMIT)
TRIES = 8


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[warmshell.AsyncClient]:
    settings = {"files.transfer_stream": False, "files.max_file_bytes": LIMIT}
    async with running_gateway(tmp_path / "state", **settings) as gw:
        await sandbox(gw, "s")
        await gw.create(name="ended", spec=pb.SandboxSpec(command=["true"]))
        ended = await gw.wait_for("ended", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED)
        assert ended.status.phase == pb.SANDBOX_PHASE_EXITED
        async with warmshell.AsyncClient(state_dir=tmp_path / "state") as client:
            yield client


async def _refused_each_time(
    write: Callable[[], Awaitable[object]], error: type[warmshell.ApiError], message: str
) -> None:
    for _ in range(TRIES):
        with pytest.raises(error, match=message):
            await write()


def _chunks() -> Iterator[bytes]:
    """`BIG` as an iterator: a write of unknown size, which goes over gRPC whatever the gateway offers."""
    return (BIG[start : start + CHUNK_BYTES] for start in range(0, len(BIG), CHUNK_BYTES))


async def _tar() -> AsyncIterator[bytes]:
    """A tar of one file of `BIG`, as an async iterable (an upload over gRPC)."""
    header = tarfile.TarInfo("a")
    header.size = len(BIG)
    yield header.tobuf()
    for chunk in _chunks():
        yield chunk


async def test_a_refused_grpc_write_reaches_the_async_client_as_its_refusal(client: warmshell.AsyncClient) -> None:
    s, ended = await client.get("s"), await client.get("ended")
    over = f"/workspace/big: over the limit of {LIMIT} bytes"
    await _refused_each_time(
        lambda: s.files.write_chunks("/workspace/big", _chunks()), warmshell.ResourceExhausted, over
    )
    read_only = "/usr/planted: read-only"
    await _refused_each_time(
        lambda: s.files.write_chunks("/usr/planted", _chunks()), warmshell.PermissionDenied, read_only
    )
    not_ready = "ended.* is Exited"
    await _refused_each_time(
        lambda: ended.files.write_chunks("/workspace/x", _chunks()), warmshell.FailedPrecondition, not_ready
    )
    await _refused_each_time(
        lambda: s.files.upload_tar(_tar(), "/workspace"),
        warmshell.ResourceExhausted,
        f"/workspace/a: more than {LIMIT} bytes",
    )
    assert await s.files.write("/workspace/small", b"fine") == 4  # the sandbox and the gateway are fine
