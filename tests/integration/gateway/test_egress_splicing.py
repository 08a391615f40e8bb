"""The proxy's kernel-side copy (`gateway/egress/splicing`) between real sockets: a Unix socket
inside (as a sandbox's) and TCP outside (as an upstream). Bytes arrive intact both ways, what
the streams had buffered first; each end of stream is passed on as a half-close; the byte rate
holds; a cancelled splice leaves no descriptor behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from warmshell.gateway.egress import splicing
from warmshell.gateway.egress.pumping import TokenBucket

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
FAST = 10**12


@asynccontextmanager
async def _pairs(tmp_path: Path) -> AsyncIterator[tuple[Stream, Stream, Stream, Stream]]:
    """(client, proxy's inside) over a Unix socket and (proxy's outside, upstream) over TCP."""
    accepted: asyncio.Queue[Stream] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    path = str(tmp_path / "inside.sock")
    unix = await asyncio.start_unix_server(accept, path=path)
    tcp = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        client = await asyncio.open_unix_connection(path)
        inside = await accepted.get()
        outside = await asyncio.open_connection("127.0.0.1", tcp.sockets[0].getsockname()[1])
        upstream = await accepted.get()
        yield client, inside, outside, upstream
        for _, writer in (client, inside, outside, upstream):
            writer.close()
    finally:
        unix.close()
        tcp.close()


async def test_bytes_arrive_intact_both_ways_with_half_closes(tmp_path: Path) -> None:
    up_data, down_data = os.urandom(3 << 20), os.urandom(5 << 20)
    async with _pairs(tmp_path) as (client, inside, outside, upstream):
        assert splicing.available(inside[1], outside[1])
        # Bytes the streams already hold: the head's tail inside, an early answer outside.
        client[1].write(b"early-up")
        upstream[1].write(b"early-down")
        assert await inside[0].readexactly(2) == b"ea"
        assert await outside[0].readexactly(2) == b"ea"
        ups: list[int] = []
        downs: list[int] = []
        task = asyncio.create_task(
            splicing.splice_both(
                inside, outside, up=(TokenBucket(FAST), ups.append), down=(TokenBucket(FAST), downs.append)
            )
        )
        client[1].write(up_data)
        client[1].write_eof()  # the client is done sending: the upstream sees its end of stream
        got_up = await upstream[0].read()
        assert got_up == b"rly-up" + up_data
        upstream[1].write(down_data)  # and still answers after the half-close
        upstream[1].write_eof()
        got_down = await client[0].read()
        assert got_down == b"rly-down" + down_data
        await asyncio.wait_for(task, 10)
        assert (sum(ups), sum(downs)) == (len(got_up), len(got_down))


async def test_the_byte_rate_holds(tmp_path: Path) -> None:
    rate = 256 * 1024
    payload = os.urandom(rate * 5 // 2)  # a second of burst, then 1.5 s at the rate
    async with _pairs(tmp_path) as (client, inside, outside, upstream):
        start = time.monotonic()
        task = asyncio.create_task(
            splicing.splice_both(
                inside, outside, up=(TokenBucket(FAST), lambda _: None), down=(TokenBucket(rate), lambda _: None)
            )
        )
        upstream[1].write(payload)
        upstream[1].write_eof()
        assert await client[0].read() == payload
        assert time.monotonic() - start >= 1.2
        client[1].write_eof()
        await asyncio.wait_for(task, 10)


def _descriptors() -> dict[str, str]:
    """This process's open descriptors and what each is ("socket:[…]", "pipe:[…]", a path)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, gone
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return found


async def test_a_cancelled_splice_leaves_no_socket_and_few_pipes(tmp_path: Path) -> None:
    async with _pairs(tmp_path) as (client, inside, outside, upstream):
        before = _descriptors()
        task = asyncio.create_task(
            splicing.splice_both(
                inside, outside, up=(TokenBucket(FAST), lambda _: None), down=(TokenBucket(FAST), lambda _: None)
            )
        )
        client[1].write(b"x" * 100_000)
        assert len(await upstream[0].readexactly(100_000)) == 100_000
        during = {fd: what for fd, what in _descriptors().items() if fd not in before}
        assert sum(what.startswith("socket:") for what in during.values()) == 2  # the two duplicates
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        left = {fd: what for fd, what in _descriptors().items() if fd not in before}
        # Only idle pipes kept for the next splices (two descriptors each, a few at most).
        assert all(what.startswith("pipe:") for what in left.values()), left
        assert len(left) <= 4
