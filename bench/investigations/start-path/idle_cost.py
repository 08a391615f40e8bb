"""What a gateway spends per second while nothing starts: a pool of `--size` idle members held,
with and without a client polling ListPools every `--poll` seconds (as `burst.py`'s fill does),
per source tree (trees alternating round by round). A fill's "gateway CPU per member start"
is the gateway's CPU over the fill divided by the members started: a slower fill charges each
member more of these per-second costs, whatever a start itself costs.

    python bench/investigations/start-path/idle_cost.py --tree before=/tmp/before-tree/src \
        --tree after=src [--size 150] [--seconds 5] [--rounds 2]

CPU from `/proc/<pid>/task/*/schedstat` (exact, every thread). Results in `results/<name>.{json,md}`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
import alternating
from harness import GatewayProcess, gateway_process, write_results
from warm_path import idle_members, write_profile


def cpu_ns(pid: int) -> int:
    """Every thread's CPU so far (ns)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except OSError:
            continue
    return total


async def window(gw: GatewayProcess, seconds: float, poll: float | None) -> float:
    """The gateway's CPU ms per second over `seconds`, polling ListPools every `poll` s (None: not)."""
    start_ns, start = cpu_ns(gw.process.pid), time.perf_counter()
    while time.perf_counter() - start < seconds:
        if poll is None:
            await asyncio.sleep(seconds)
        else:
            await idle_members(gw, "idle")
            await asyncio.sleep(poll)
    return (cpu_ns(gw.process.pid) - start_ns) / 1e6 / (time.perf_counter() - start)


async def one(src: Path, size: int, seconds: float, poll: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ws-idle-cost-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"[local]\nmax_pool_replicas = {size}\npool_reload_interval_seconds = 0.2\n")
        async with gateway_process("--pools", str(pools), "--config", str(config), src=src) as gw:
            write_profile(pools, "idle", size, {"POOL": "idle"})
            while await idle_members(gw, "idle") < size:
                await asyncio.sleep(0.1)
            await asyncio.sleep(2)  # settled
            quiet = await window(gw, seconds, None)
            polled = await window(gw, seconds, poll)
    return {"idle_ms_per_s": quiet, "polled_ms_per_s": polled, "load": list(os.getloadavg())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    alternating.add_tree_option(parser)
    parser.add_argument("--size", type=int, default=150, help="idle members held (default 150)")
    parser.add_argument("--seconds", type=float, default=5, help="each window (default 5)")
    parser.add_argument("--poll", type=float, default=0.02, help="ListPools every POLL s (default 0.02, as burst.py)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each one gateway per tree (default 2)")
    parser.add_argument("--name", default="idle_cost", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    trees = alternating.trees(args.tree)
    runs = alternating.alternate(
        trees, args.rounds, lambda _tree, src, _round: asyncio.run(one(src, args.size, args.seconds, args.poll))
    )
    out = f"Gateway CPU ms per second with {args.size} idle members (medians over the rounds)\n\n"
    out += "| tree | idle | polling ListPools | loads |\n|---|---|---|---|\n"
    for tree, rs in runs.items():
        idle = statistics.median(r["idle_ms_per_s"] for r in rs)
        polled = statistics.median(r["polled_ms_per_s"] for r in rs)
        loads = ", ".join(f"{r['load'][0]:.1f}" for r in rs)
        out += f"| {tree} | {idle:.1f} | {polled:.1f} | {loads} |\n"
    write_results(args.name, {"trees": trees, "args": vars(args), "runs": runs}, out)


if __name__ == "__main__":
    main()
