"""Issue 31: the gateway's event loop under cProfile (`bench/profiled_gateway.py`, thread CPU
clock) over `--forks` fork(10) calls of an idle parent with an empty /workspace, only the calls
recorded (not the deletes between them), for the ranking of what a fork's children cost it.

    python bench/investigations/fork-timeline/fork_profile.py [--forks 10] [--top 40]

Writes the top functions by cumulative and by own time as `results/fork_profile.md`. cProfile
inflates small, frequently called functions: read it for the ranking and the call counts per
child, not for absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import gateway_process, write_results
from snapshots import import_images, prune

from warmshell.api.v1 import sandbox_pb2 as pb


async def measure(args: argparse.Namespace, work: Path, out: Path) -> None:
    async with gateway_process(cprofile=out) as gw:
        await asyncio.to_thread(import_images, gw.state, work, 1)
        await gw.create_ready(name="parent", spec=pb.SandboxSpec(image="bench/tools:1"))
        for turn in range(args.forks + 1):  # the first is a warm-up, not recorded
            if turn:
                gw.process.send_signal(signal.SIGUSR1)
            request = pb.ForkSandboxRequest(name="parent", count=10, prefix=f"p{turn}", ready_timeout_ms=120_000)
            response = await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)
            if turn:
                gw.process.send_signal(signal.SIGUSR2)
            for child in response.children:
                await gw.delete(child.name)
            await prune(gw)
        for _ in range(100):
            if out.exists():
                break
            await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: images of the image store need a gateway run as root")
    text = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="ws-fork-profile-") as tmp:
        out = Path(tmp) / "fork.pstats"
        asyncio.run(measure(args, Path(tmp), out))
        stats = pstats.Stats(str(out), stream=text)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    body = text.getvalue().replace(str(Path.cwd()) + "/", "")
    write_results("fork_profile", {"forks": args.forks, "children": 10 * args.forks}, "```\n" + body + "\n```")


if __name__ == "__main__":
    main()
