"""What one small write costs the writer on loopback, over TLS (kubesim's certificate, asyncio's
SSL, as the API server writes a watch event to the gateway) and in plain TCP: a server writes
`--writes` lines of `--size` bytes, one per event-loop tick, to a reader in another process.

    python bench/investigations/kubesim-api-cpu/tls_write.py [--writes N] [--size B] [--pairs P]

It prints the writer's CPU per write (user and system, thread time) and its wall time per write:
the gap between them is the writer waiting for a cpu after waking the reader, which a wall-clock
sampler such as py-spy counts as time spent in the send.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kubesim.apiserver import tls

READER = """
import socket, ssl, sys
port, use_tls, ca = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
s = socket.create_connection(("127.0.0.1", port))
if use_tls:
    s = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="127.0.0.1")
s.sendall(b"g")
while s.recv(65536):
    pass
"""


async def one(use_tls: bool, writes: int, size: int, certs: tls.Certificates, ca: Path) -> tuple[float, float, float]:
    """(user µs, system µs, wall µs) per write."""
    result: asyncio.Future[tuple[float, float, float]] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        line = b"x" * (size - 1) + b"\n"
        before, start = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        for _ in range(writes):
            writer.write(line)
            await asyncio.sleep(0)  # one write per tick, as a watch event arrives
        await writer.drain()
        after, wall = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter() - start
        writer.close()
        per = 1e6 / writes
        result.set_result(
            ((after.ru_utime - before.ru_utime) * per, (after.ru_stime - before.ru_stime) * per, wall * per)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=certs.server_context() if use_tls else None)
    port = server.sockets[0].getsockname()[1]
    reader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READER, str(port), "1" if use_tls else "0", str(ca)
    )
    try:
        return await result
    finally:
        await reader.wait()
        server.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    certs = tls.generate()
    with tempfile.TemporaryDirectory() as tmp:
        ca = Path(tmp) / "ca.pem"
        ca.write_bytes(certs.ca_pem)
        runs: dict[str, list[tuple[float, float, float]]] = {"TLS": [], "plain": []}
        for _ in range(args.pairs):  # alternating
            runs["TLS"].append(await one(True, args.writes, args.size, certs, ca))
            runs["plain"].append(await one(False, args.writes, args.size, certs, ca))
    for name, rows in runs.items():
        user, system, wall = (statistics.median(r[i] for r in rows) for i in range(3))
        print(
            f"{name}: {user:.1f} us user + {system:.1f} us system = {user + system:.1f} us CPU"
            f" per {args.size}-byte write; wall {wall:.1f} us"
        )


if __name__ == "__main__":
    asyncio.run(main())
