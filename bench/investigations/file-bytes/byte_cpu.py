"""Where a transferred byte's CPU goes (issue 33, "a faster byte path"): the same rounds measure
a bare grpc.aio client-streaming call that only counts the bytes it receives (the floor, at three
message sizes), and the gateway's FileService through `warmshell.AsyncClient` (a 5 MiB write and
read, and a 1-byte write and read: the fixed cost of a call), each with the receiving process's
CPU and the client's.

    python bench/investigations/file-bytes/byte_cpu.py [--rounds 20]

CPU is per process (the gateway's and the floor server's from /proc schedstat, every thread;
the client's from getrusage around the call), p50 over the rounds, sizes and trees alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
from harness import gateway_process, write_results
from sdk_transfers import _cpu_seconds, _floor_server

import warmshell
from warmshell.api.v1 import sandbox_pb2 as pb

BLOB = 5 * 1024 * 1024
SIZES = (256 * 1024, 1024 * 1024, 3 * 1024 * 1024)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _timed(pid: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float, float]:
    """Wall ms, the receiving process's CPU ms and the client's CPU ms of one call."""
    theirs, mine, start = _cpu_seconds(pid), _own_cpu(), time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000, (_cpu_seconds(pid) - theirs) * 1000, (_own_cpu() - mine) * 1000


def _floor_send(channel: grpc.aio.Channel, data: bytes, size: int) -> Callable[[], Awaitable[Any]]:
    async def send() -> None:
        call = channel.stream_unary(
            "/floor.Floor/Count",
            request_serializer=pb.WriteFileRequest.SerializeToString,
            response_deserializer=pb.WriteFileResponse.FromString,
        )()
        view = memoryview(data)
        for start in range(0, len(data), size):
            await call.write(pb.WriteFileRequest(data=bytes(view[start : start + size])))
        await call.done_writing()
        await call

    return send


async def measure(rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    runs: dict[str, list[tuple[float, float, float]]] = {}
    data, byte = os.urandom(BLOB), b"x"
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="byte-cpu-")))
        floor = subprocess.Popen([sys.executable, __file__, "--floor-server", str(tmp / "floor.sock")])
        stack.callback(floor.kill)
        gw = await stack.enter_async_context(gateway_process())
        client = await stack.enter_async_context(warmshell.AsyncClient(state_dir=gw.state))
        sb = await client.create(name="bytes")
        await sb.files.write("/workspace/big", data)
        await sb.files.write("/workspace/small", byte)
        while not (tmp / "floor.sock").exists():
            await asyncio.sleep(0.05)
        options = [("grpc.max_send_message_length", -1)]
        channel = grpc.aio.insecure_channel(f"unix://{tmp / 'floor.sock'}", options=options)
        stack.push_async_callback(channel.close)
        calls: dict[str, tuple[int, Callable[[], Awaitable[Any]]]] = {
            **{f"floor: 5 MiB in {s // 1024} KiB messages": (floor.pid, _floor_send(channel, data, s)) for s in SIZES},
            "gateway: 5 MiB write": (gw.process.pid, lambda: sb.files.write("/workspace/big", data)),
            "gateway: 5 MiB read": (gw.process.pid, lambda: sb.files.read("/workspace/big")),
            "gateway: 1-byte write": (gw.process.pid, lambda: sb.files.write("/workspace/small", byte)),
            "gateway: 1-byte read": (gw.process.pid, lambda: sb.files.read("/workspace/small")),
        }
        for _pid, call in calls.values():
            await call()  # warm: the first call of each kind pays for connections and imports
        for _ in range(rounds):
            for label, (pid, call) in calls.items():
                runs.setdefault(label, []).append(await _timed(pid, call))
        await sb.delete()
    return runs


def table(runs: dict[str, list[tuple[float, float, float]]], rounds: int) -> str:
    out = (
        f"| call ({rounds} rounds) | wall p50 ms | MB/s | receiver CPU p50 ms | client CPU p50 ms |\n"
        "|---|---|---|---|---|\n"
    )
    for label, samples in runs.items():
        wall, theirs, mine = (statistics.median(s[i] for s in samples) for i in range(3))
        rate = f"{BLOB / wall / 1000:.0f}" if "5 MiB" in label else ""
        out += f"| {label} | {wall:.1f} | {rate} | {theirs:.1f} | {mine:.1f} |\n"
    load = os.getloadavg()[0]
    return out + f"\n1-minute load {load:.1f} at the end (2 cores shared with other work).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--floor-server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        asyncio.run(_floor_server(args.floor_server, max_receive=8 * 1024 * 1024))  # 3 MiB messages too
        return
    runs = asyncio.run(measure(args.rounds))
    write_results("byte_cpu", {"rounds": args.rounds, "runs": runs}, table(runs, args.rounds))


if __name__ == "__main__":
    main()
