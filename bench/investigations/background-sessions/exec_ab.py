"""Issue 33: the foreground exec round trip with background commands kept by the supervisor,
against an older tree, alternating.

Two gateways run at once, one on this tree and one on `--before-src` (an older tree's `src/`,
with its agent built), each with one Ready sandbox. Rounds alternate between them: each round
is `--execs` round trips of `true` (ExecSandbox, API call to exit code), one at a time. Per
round: the wall time per exec (p50) and the gateway process's CPU per exec (utime + stime from
/proc, which on the local driver includes the sandbox's host-side supervisor). The ratio of the
medians over rounds is the figure; the two sides share the host's load, round by round.

    python bench/investigations/background-sessions/exec_ab.py --before-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import GatewayProcess, gateway_process, summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, every thread, in nanoseconds' resolution (the scheduler's
    run time from /proc/PID/task/*/schedstat, where /proc/PID/stat counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


async def round_trips(gw: GatewayProcess, execs: int) -> tuple[float, float]:
    """`execs` round trips of `true`: (p50 wall ms, gateway CPU ms per exec)."""
    request = pb.ExecSandboxRequest(name="target", command=["true"])
    wall = []
    cpu_before = cpu_seconds(gw.process.pid)
    for _ in range(execs):
        start = time.perf_counter()
        code = None
        async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
            if event.WhichOneof("event") == "exit_code":
                code = event.exit_code
        wall.append((time.perf_counter() - start) * 1000)
        assert code == 0
    cpu = (cpu_seconds(gw.process.pid) - cpu_before) * 1000 / execs
    return statistics.median(wall), cpu


async def measure(before_src: Path, rounds: int, execs: int) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {"before": {"wall": [], "cpu": []}, "after": {"wall": [], "cpu": []}}
    async with contextlib.AsyncExitStack() as stack:
        trees = {
            "before": await stack.enter_async_context(gateway_process(src=before_src)),
            "after": await stack.enter_async_context(gateway_process()),
        }
        for gw in trees.values():
            await gw.create_ready(name="target")
            await round_trips(gw, 30)  # warm-up: connections, first forks
        for index in range(rounds):
            order = ("before", "after") if index % 2 == 0 else ("after", "before")
            for side in order:
                wall, cpu = await round_trips(trees[side], execs)
                samples[side]["wall"].append(wall)
                samples[side]["cpu"].append(cpu)
        for gw in trees.values():
            await gw.delete("target")
    result: dict[str, Any] = {side: {k: summary(v) for k, v in s.items()} for side, s in samples.items()}
    result["ratio_after_over_before"] = {
        k: statistics.median(samples["after"][k]) / statistics.median(samples["before"][k]) for k in ("wall", "cpu")
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before-src", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--name", default="exec_ab")
    args = parser.parse_args()
    data = asyncio.run(measure(args.before_src, args.rounds, args.execs))
    ratio = data["ratio_after_over_before"]
    table = "| tree | wall p50 per exec, median of rounds (ms) | gateway CPU per exec, median of rounds (ms) |\n"
    table += "|---|---|---|\n"
    for side in ("before", "after"):
        table += f"| {side} | {data[side]['wall']['p50']:.2f} | {data[side]['cpu']['p50']:.3f} |\n"
    markdown = (
        f"Foreground exec round trip, before/after (alternating rounds)\n\n{table}\n"
        f"after / before: wall x{ratio['wall']:.3f}, CPU x{ratio['cpu']:.3f} "
        f"({args.rounds} rounds of {args.execs} execs per tree).\n"
    )
    write_results(args.name, data, markdown)


if __name__ == "__main__":
    main()
