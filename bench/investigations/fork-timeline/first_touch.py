"""Issue 31: why a fork's 200 MB copy sometimes costs ten times its usual CPU on this VM.

    python bench/investigations/fork-timeline/first_touch.py [--forks 3] [--perf FILE]

One gateway, a parent with 200 MB in /workspace; a tagged snapshot of it (200 MB more of the
store's page cache, synced), then `--forks` fork(10) of it, each pruned after, as
`bench/snapshots.py` does: the gateway's CPU over each fork call (its threads' scheduler time).
With `--perf FILE`, `perf record -g` samples the gateway over the forks (read it with `perf
report -i FILE --no-children --sort symbol -G`: the copy's `memcpy` into ext4's page cache).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import gateway_process, write_results
from snapshots import fork_measured, fork_parents, import_images, snapshot


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    async with gateway_process() as gw:
        await asyncio.to_thread(import_images, gw.state, work, 1)
        await fork_parents(gw, 200)
        await snapshot(gw, "parent-full", "bench/full-snap:1")
        perf = None
        if args.perf:
            command = ["perf", "record", "-g", "-o", str(args.perf), "-p", str(gw.process.pid)]
            perf = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(0.5)
        forks = []
        for turn in range(args.forks):
            wall, cpu = await fork_measured(gw, "parent-full", f"t{turn}", 10)
            forks.append({"wall_ms": wall, "gateway_cpu_in_call_ms": cpu})
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
    return {"forks": forks, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=3)
    parser.add_argument("--perf", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: images of the image store need a gateway run as root")
    with tempfile.TemporaryDirectory(prefix="ws-first-touch-") as tmp:
        data = asyncio.run(measure(args, Path(tmp)))
    lines = ["| fork(10) of the 200 MB parent | wall ms | the gateway's CPU in the call ms |", "|---|---|---|"]
    for number, row in enumerate(data["forks"], 1):
        lines.append(f"| {number} | {row['wall_ms']:.0f} | {row['gateway_cpu_in_call_ms']:.0f} |")
    lines += ["", f"Load (1 min) at the end: {data['load']:.1f}."]
    write_results("first_touch", data, "\n".join(lines))


if __name__ == "__main__":
    main()
