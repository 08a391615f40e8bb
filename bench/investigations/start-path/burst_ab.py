"""Issue 29's last check: `bench/burst.py --quick` run against several source trees in one
session, trees alternating round by round, so that the drift of a shared machine's load falls on
each alike; one table of the figures the check compares (medians over the rounds, each round's
load beside it).

    python bench/investigations/start-path/burst_ab.py --tree before=/tmp/before-tree/src \
        --tree after=src [--rounds 3]

Each `--tree NAME=DIR` is a `src/` directory with its agent and launcher built
(`scripts/build-agent` in that tree); `burst.py --src DIR` runs the gateway from it (the
benchmark's own client code is this tree's). The figures of each run that the table reads are kept
in `results/<name>.json`; the runs' own result files are not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness
import alternating
import burst
from harness import write_results

BENCH = Path(__file__).resolve().parents[2]
NAN = float("nan")

# (label, how to read it from a burst.py result)
FIGURES: tuple[tuple[str, Any], ...] = (
    ("cold create -> Ready p50, ms", lambda d: d["cold"]["client_ms"]["p50"]),
    ("sequential warm create -> Ready, client p50, ms", lambda d: d["sequential"]["client_ms"]["p50"]),
    ("sequential warm create -> Ready, server p50, ms", lambda d: d["sequential"]["server_ms"]["p50"]),
    *(
        # NaN for a run whose sequential creates all went cold (no warm timeline to read).
        (f"… {label}, p50, ms", lambda d, label=label: d["sequential"]["warm_steps_ms"].get(label, {}).get("p50", NAN))
        for label, _, _ in burst.WARM_STEPS
    ),
    ("CPU per member start, ms", lambda d: d["fill"]["cpu_ms_per_member"]),
    ("… in the gateway, ms", lambda d: d["fill"]["gateway_cpu_ms_per_member"]),
    ("… … of it the benchmark's ListPools polls, ms", lambda d: d["fill"]["poll_cpu_ms_per_member"]),
    ("… … the rest: the starts' own, ms", lambda d: _less_polls(d["fill"])),
    ("… in the member's processes, ms", lambda d: d["fill"]["member_processes_cpu_ms_per_member"]),
    ("refill, members/s (from the profile)", lambda d: d["fill"]["members_per_s"]),
    ("refill, members/s (10th to 90th percent)", lambda d: d["fill"]["steady_members_per_s"]),
    ("idle member, processes", lambda d: d["fill"]["processes_per_member"]),
    ("idle member, PSS MB", lambda d: d["fill"]["pss_mb_per_member"]),
)


def _less_polls(fill: dict[str, Any]) -> float:
    """The gateway's CPU per member start without the benchmark's ListPools polls."""
    return float(fill["gateway_cpu_ms_per_member"] - fill["poll_cpu_ms_per_member"])


def run(name: str, tree: str, src: Path, round_: int) -> dict[str, Any]:
    """One `burst.py --quick` against `src`; its result (its files removed from bench/results/)."""
    label = f"{name}_{tree}_{round_}"
    command = [sys.executable, str(BENCH / "burst.py"), "--quick", "--src", str(src), "--name", label]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    data: dict[str, Any] = json.loads((BENCH / "results" / f"{label}.json").read_text())
    for suffix in (".json", ".md"):
        (BENCH / "results" / f"{label}{suffix}").unlink()
    return data


def table(trees: list[str], runs: dict[str, list[dict[str, Any]]]) -> str:
    first, others = trees[0], trees[1:]
    ratios = " | ".join(f"{tree} / {first}" for tree in others)
    out = f"| figure | {' | '.join(trees)} | {ratios} |\n|---|{'---|' * (2 * len(trees) - 1)}\n"
    for label, read in FIGURES:
        medians = {tree: statistics.median(read(d) for d in runs[tree]) for tree in trees}
        ratio = " | ".join(f"{medians[t] / medians[first]:.2f}" if medians[first] else "nan" for t in others)
        out += f"| {label} | {' | '.join(f'{medians[t]:.3g}' for t in trees)} | {ratio} |\n"
    out += "\n| round | tree | cold p50 | warm p50 | CPU/start | gateway | … polls | members | members/s | load |\n"
    out += "|---|---|---|---|---|---|---|---|---|---|\n"
    for round_ in range(len(runs[first])):
        for tree in trees:
            d = runs[tree][round_]
            f = d["fill"]
            out += (
                f"| {round_} | {tree} | {d['cold']['client_ms']['p50']:.1f} "
                f"| {d['sequential']['client_ms']['p50']:.2f} "
                f"| {f['cpu_ms_per_member']:.2f} | {f['gateway_cpu_ms_per_member']:.2f} "
                f"| {f['poll_cpu_ms_per_member']:.2f} "
                f"| {f['member_processes_cpu_ms_per_member']:.2f} | {f['members_per_s']:.0f} | {f['load'][0]} |\n"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    alternating.add_tree_option(parser)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one run per tree (default 3)")
    parser.add_argument("--name", default="burst_ab", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    trees = alternating.trees(args.tree)
    runs = alternating.alternate(trees, args.rounds, lambda tree, src, round_: run(args.name, tree, src, round_))
    data = {
        "trees": trees,
        "runs": {
            t: [
                r["fill"]
                | {
                    "cold": r["cold"]["client_ms"],
                    "sequential": r["sequential"]["client_ms"],
                    "sequential_server": r["sequential"]["server_ms"],
                    "warm_steps": r["sequential"]["warm_steps_ms"],
                }
                for r in rs
            ]
            for t, rs in runs.items()
        },
        "load": list(os.getloadavg()),
    }
    write_results(args.name, data, table(list(trees), runs))


if __name__ == "__main__":
    main()
