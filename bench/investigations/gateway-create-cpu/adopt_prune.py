"""The gateway's CPU per supervisor registration spent on its background-command table
(`BackgroundProcesses.adopt`, which prunes the table): every member started and every warm create's
session registers, and each idle member's open session keeps an entry, so a prune that walks the
whole table grows with the pool. Thread CPU per `adopt`, with N sessions already open, for each
`--tree` (its `src/`, in a child process of its own), trees alternating round by round.

    python bench/investigations/gateway-create-cpu/adopt_prune.py --tree before=/tmp/s40-base/src \
        --tree after=src [--members 20,100,500] [--calls 200] [--rounds 3]

Results in `results/<name>.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
from harness import write_results

# Run in the child, against the tree on its PYTHONPATH: µs of thread CPU per adopt.
_CHILD = """
import asyncio, sys, time
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.ids import SandboxId
from warmshell.gateway.background import BackgroundProcesses
from warmshell.gateway.execs import ExecRelay
from warmshell.gateway.sessions import SupervisorSession

async def main(members: int, calls: int) -> float:
    table = BackgroundProcesses(ExecRelay(window_bytes=1024, stall_seconds=1.0), history_bytes=4096)
    for index in range(members):  # the idle pool: one open session each
        table.adopt(SupervisorSession(SandboxId(f"sb-idle-{index}"), "i", f"s-{index}"), spb.SupervisorHello())
    sessions = [SupervisorSession(SandboxId(f"sb-new-{index}"), "i", f"n-{index}") for index in range(calls)]
    hello = spb.SupervisorHello()
    start = time.thread_time_ns()
    for session in sessions:  # each one closed after (a deleted sandbox's): the table stays at N
        table.adopt(session, hello)
        session.close()
    spent = time.thread_time_ns() - start
    await table.aclose()
    return spent / calls / 1000

print(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]))))
"""


def one_run(src: str, members: int, calls: int) -> float:
    """µs of CPU per adopt with `members` open sessions, the gateway code from `src`."""
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(members), str(calls)], env=env, check=True, capture_output=True, text=True
    )
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="NAME=SRC_DIR (repeat)")
    parser.add_argument("--members", default="20,100,500", help="open sessions before the timed adopts")
    parser.add_argument("--calls", type=int, default=200, help="timed adopts per run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each tree once per round")
    parser.add_argument("--name", default="adopt_prune", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.tree)
    sizes = [int(size) for size in args.members.split(",")]
    runs: dict[str, dict[int, list[float]]] = {name: {size: [] for size in sizes} for name in trees}
    for _ in range(args.rounds):
        for size in sizes:
            for name, src in trees.items():
                runs[name][size].append(one_run(src, size, args.calls))
    medians = {name: {size: statistics.median(values) for size, values in by.items()} for name, by in runs.items()}
    names = list(trees)
    lines = [
        "| open sessions | " + " | ".join(f"{name}, µs CPU per adopt" for name in names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    lines += [f"| {size} | " + " | ".join(f"{medians[name][size]:.1f}" for name in names) + " |" for size in sizes]
    lines.append(f"\nMedians over {args.rounds} rounds of {args.calls} adopts; trees: {json.dumps(trees)}.")
    write_results(args.name, {"trees": trees, "runs": runs, "medians": medians}, "\n".join(lines))


if __name__ == "__main__":
    main()
