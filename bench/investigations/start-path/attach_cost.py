"""What the egress gate's `attach` costs an activation without egress (the default policy, no
secrets), unprofiled: thread CPU per call over many calls, warm (a pool's member: the driver's
pool views are read) and cold, per source tree, trees alternating.

    python bench/investigations/start-path/attach_cost.py --tree main=/tmp/main-tree/src --tree after=src

Each tree's gate runs in a child process with that tree first on `PYTHONPATH`; the pools are
`--pools` views made afresh at each read, as the local driver's `pools()` does.
Results in `results/<name>.{json,md}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness


def measure(pools: int, calls: int) -> dict[str, float]:
    """In this process (the tree under test imported): µs of thread CPU per attach, warm and cold."""
    from warmshell.core.config import NetworkConfig
    from warmshell.core.ids import Fingerprint, SandboxId
    from warmshell.core.models import SandboxRecord
    from warmshell.drivers.base import PoolView
    from warmshell.gateway.egress.gate import EgressGate
    from warmshell.gateway.egress.proxy import EgressProxy

    def views() -> list[PoolView]:
        return [
            PoolView(
                name=f"p{i}",
                workspace="default",
                fingerprint=Fingerprint(f"{i:016x}"),
                image="",
                environment={},
                cpu="1",
                memory="512Mi",
                desired=10,
                ready=10,
                idle=10,
                hits=0,
                misses=0,
                source=f"p{i}.toml",
            )
            for i in range(pools)
        ]

    class Sockets:
        def __init__(self, directory: Path) -> None:
            self.directory = directory

        def egress_socket(self, instance_id: str) -> Path | None:
            return self.directory / instance_id / "proxy.sock"

    async def run() -> dict[str, float]:
        network = NetworkConfig()
        gate = EgressGate(network, EgressProxy(network), Sockets(Path(tempfile.gettempdir())), pools=views)
        record = SandboxRecord(id=SandboxId("sb-1"), name="one")
        out = {}
        for label, pool in (("warm", Fingerprint(f"{pools - 1:016x}")), ("cold", None)):
            start = time.thread_time()
            for _ in range(calls):
                await gate.attach(record, "i-1", pool, {})
            out[label] = (time.thread_time() - start) / calls * 1e6
        return out

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a tree's src/")
    parser.add_argument("--pools", type=int, default=3, help="pools the driver has (default 3)")
    parser.add_argument("--calls", type=int, default=20000, help="attaches per measurement (default 20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one child per tree (default 3)")
    parser.add_argument("--name", default="attach_cost", help="results/NAME.{json,md} beside this script")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.pools, args.calls)))
        return
    import alternating
    from harness import write_results

    def child(_tree: str, src: Path, _round: int) -> dict[str, float]:
        env = {**os.environ, "PYTHONPATH": str(src)}
        command = [sys.executable, __file__, "--child", "--pools", str(args.pools), "--calls", str(args.calls)]
        result: dict[str, float] = json.loads(subprocess.run(command, env=env, capture_output=True, check=True).stdout)
        return result

    trees = alternating.trees(args.tree)
    runs = alternating.alternate(trees, args.rounds, child)
    out = f"µs of CPU per `attach` without egress, {args.pools} pools (medians over the rounds)\n\n"
    out += "| tree | warm | cold |\n|---|---|---|\n"
    for tree, rs in runs.items():
        warm, cold = (statistics.median(r[k] for r in rs) for k in ("warm", "cold"))
        out += f"| {tree} | {warm:.1f} | {cold:.1f} |\n"
    data: dict[str, Any] = {"trees": trees, "pools": args.pools, "calls": args.calls, "runs": runs}
    write_results(args.name, data, out)


if __name__ == "__main__":
    main()
