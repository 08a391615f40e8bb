"""Issue 31: one lone cold create -> Ready, and its delete until the record is gone, on a gateway of
this tree against one of another tree (e.g. main's), both up at once, taking turns: of the
benchmark's small image and of the host's root, each after `--pause` seconds of quiet (as a lone
create comes: the cgroup entry's RCU wait, when there was one, is paid then).

    python bench/investigations/fork-copy/cold_ab.py --versus SRC [--rounds 10] [--pause 0.5]

Run as root (images of the store). Per tree and kind: wall ms p50, mean and min.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import GatewayProcess, gateway_process, summary, write_results
from snapshots import SMALL, import_images

from warmshell.api.v1 import sandbox_pb2 as pb

KINDS = {"image": pb.SandboxSpec(image=SMALL), "host-root": pb.SandboxSpec()}


async def gone(gw: GatewayProcess, name: str) -> None:
    """Until the record is gone (the delete finished: processes, cgroup, directories)."""
    while True:
        try:
            await gw.stub.GetSandbox(pb.SandboxRef(name=name), metadata=gw.metadata)
        except grpc.aio.AioRpcError:
            return
        await asyncio.sleep(0.002)


async def one(gw: GatewayProcess, name: str, spec: pb.SandboxSpec) -> tuple[float, float]:
    began = time.perf_counter()
    await gw.create_ready(name=name, spec=spec)
    created = time.perf_counter()
    await gw.delete(name)
    await gone(gw, name)
    return (created - began) * 1000, (time.perf_counter() - created) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versus", type=Path, required=True, help="another tree's src/ (its agent built)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.5)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        gateways: dict[str, GatewayProcess] = {}
        for side, src in (("this", None), ("versus", args.versus)):
            gw = await stack.enter_async_context(gateway_process(src=src))
            with tempfile.TemporaryDirectory() as work:
                await asyncio.to_thread(import_images, gw.state, Path(work), 1)
            for kind, spec in KINDS.items():
                await one(gw, f"warm-{kind}", spec)  # caches
            gateways[side] = gw
        for turn in range(args.rounds):
            for side in ("this", "versus") if turn % 2 == 0 else ("versus", "this"):
                for kind, spec in KINDS.items():
                    await asyncio.sleep(args.pause)
                    create, delete = await one(gateways[side], f"c{turn}-{kind}", spec)
                    rows.setdefault(f"{side}_{kind}_create", []).append(create)
                    rows.setdefault(f"{side}_{kind}_delete", []).append(delete)
    data: dict[str, Any] = {key: summary(values) for key, values in rows.items()}
    data["load"] = os.getloadavg()[0]
    lines = ["| tree, kind, step | wall p50 ms | mean | min |", "|---|---|---|---|"]
    for key, values in sorted(rows.items()):
        lines.append(f"| {key} | {statistics.median(values):.1f} | {statistics.mean(values):.1f} | {min(values):.1f} |")
    lines += ["", f"Versus: `{args.versus}`; pause {args.pause} s. Load (1 min) at the end: {data['load']:.1f}."]
    write_results("cold_ab", data, "\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
