"""Where a sequential warm create's server time goes, per tree: the gateway runs under
`traced_warm_gateway.py` (each step of the warm path timed where the tree keeps it), trees
alternating round by round; per step, the median over each tree's creates, and the server's
timeline (requested -> claimed -> activated -> Ready) of the same creates.

    python bench/investigations/start-path/warm_steps.py --tree before=/tmp/before-tree/src \\
        --tree after=src [--rounds 3] [--creates 100]

Each `--tree NAME=DIR` is a `src/` with its agent and launcher built. Wall times: read the
ratios of one run (trees alternating), not the absolute figures, on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
import alternating
import burst
from harness import gateway_process, write_results
from warm_path import write_profile

ENTRY = Path(__file__).with_name("traced_warm_gateway.py")
POOL = 10


async def _round(src: Path, creates: int) -> dict[str, list[float]]:
    """One gateway from `src`: a pool of POOL, 20 warm-up creates, then `creates` traced ones."""
    with tempfile.TemporaryDirectory(prefix="ws-steps-") as tmp:
        pools, trace = Path(tmp) / "pools", Path(tmp) / "trace.json"
        pools.mkdir()
        write_profile(pools, "seq", POOL, burst.SEQ_ENV)
        config = Path(tmp) / "gateway.toml"
        config.write_text("[local]\npool_reload_interval_seconds = 0.2\n")
        env = {"WARMSHELL_TRACE": str(trace)}
        async with gateway_process("--pools", str(pools), "--config", str(config), src=src, env=env, entry=ENTRY) as gw:
            await burst.settle(gw, "seq", POOL, timeout=120)
            await burst.sequential(gw, "warmup", 20, burst.SEQ_ENV)
            gw.process.send_signal(signal.SIGUSR1)
            timeline = await burst.sequential(gw, "seq", creates, burst.SEQ_ENV)
            gw.process.send_signal(signal.SIGUSR2)
            while not trace.exists():
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # written whole by then: a few KB
            steps: dict[str, list[float]] = json.loads(trace.read_text())
    steps["server timeline"] = [timeline["server_ms"]["p50"]]
    for label, summary in timeline["warm_steps_ms"].items():
        steps[f"timeline: {label}"] = [summary["p50"]]
    return steps


def summarize(runs: dict[str, list[dict[str, list[float]]]]) -> dict[str, list[dict[str, dict[str, float]]]]:
    """Per tree, per round, per step: the p50 and the count (not every duration: 100s per step)."""
    return {
        tree: [{label: {"p50": statistics.median(v), "n": len(v)} for label, v in r.items() if v} for r in rounds]
        for tree, rounds in runs.items()
    }


def table(runs: dict[str, list[dict[str, list[float]]]]) -> str:
    trees = list(runs)
    first = trees[0]
    labels = list(dict.fromkeys(label for rounds in runs.values() for r in rounds for label in r))
    out = f"| step (p50 ms) | {' | '.join(trees)} | {' | '.join(f'{t} / {first}' for t in trees[1:])} |\n"
    out += f"|---|{'---|' * (2 * len(trees) - 1)}\n"
    for label in labels:
        medians = {}
        for tree in trees:
            values = [v for r in runs[tree] for v in r.get(label, [])]
            medians[tree] = statistics.median(values) if values else float("nan")
        ratios = " | ".join(f"{medians[t] / medians[first]:.2f}" for t in trees[1:])
        out += f"| {label} | {' | '.join(f'{medians[t]:.3f}' for t in trees)} | {ratios} |\n"
    return out + f"\nLoad at the end {[round(x, 2) for x in os.getloadavg()]} (a shared 2-core machine).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    alternating.add_tree_option(parser)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one gateway per tree (default 3)")
    parser.add_argument("--creates", type=int, default=100, help="traced warm creates per round (default 100)")
    parser.add_argument("--name", default="warm_steps", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    trees = alternating.trees(args.tree)
    runs = alternating.alternate(trees, args.rounds, lambda _, src, __: asyncio.run(_round(src, args.creates)))
    write_results(args.name, {"trees": trees, "rounds": summarize(runs), "load": list(os.getloadavg())}, table(runs))


if __name__ == "__main__":
    main()
