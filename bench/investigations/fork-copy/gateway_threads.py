"""Issue 31: the gateway's CPU per forked child, by thread (its event loop `python`, the spawner
threads `warmshell-spawn`, the SQLite writer `ws-sqlite`, gRPC's), from each thread's schedstat
(the scheduler's nanoseconds), over the fork calls alone (not the deletes and prunes after them);
with `--cprofile`, the event loop's own functions over the same calls, ranked (cProfile inflates
small functions: read it for the ranking and the calls per child).

    python bench/investigations/fork-copy/gateway_threads.py [--forks 6] [--cprofile] [--src SRC] [--name NAME]

Run as root (images of the store). One gateway with the benchmark's small image and an empty fork
parent; `--forks` times fork(10) of it (after one not counted), its children deleted and the
fork's image pruned between calls.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

from harness import GatewayProcess, gateway_process, write_results
from snapshots import SMALL, import_images, prune

from warmshell.api.v1 import sandbox_pb2 as pb

CHILDREN = 10


def by_thread(pid: int) -> collections.Counter[str]:
    """Nanoseconds on a CPU so far, per thread name."""
    found: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found[(task / "comm").read_text().strip()] += int((task / "schedstat").read_text().split()[0])
    return found


async def forks(gw: GatewayProcess, count: int, profiled: bool) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for turn in range(count + 1):
        if turn and profiled:
            gw.process.send_signal(signal.SIGUSR1)
        before = by_thread(gw.process.pid)
        request = pb.ForkSandboxRequest(name="parent", count=CHILDREN, prefix=f"c{turn}", ready_timeout_ms=120_000)
        response = await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)
        after = by_thread(gw.process.pid)
        if turn and profiled:
            gw.process.send_signal(signal.SIGUSR2)  # writes the statistics so far
        if turn:
            total.update({name: after[name] - before.get(name, 0) for name in after})
        for child in response.children:
            await gw.delete(child.name)
        await prune(gw)
    return total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=6)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--src", type=Path, default=None, help="another tree's src/ to run instead")
    parser.add_argument("--name", default="gateway_threads", help="the results' name")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        profile = Path(work) / "gateway.prof" if args.cprofile else None
        async with gateway_process(cprofile=profile, src=args.src) as gw:
            await asyncio.to_thread(import_images, gw.state, Path(work), 1)
            await gw.create_ready(name="parent", spec=pb.SandboxSpec(image=SMALL))
            total = await forks(gw, args.forks, profile is not None)
            await asyncio.sleep(0.5)  # the profile's file written
        top = ranked(profile, args.forks * CHILDREN) if profile is not None else []
    children = args.forks * CHILDREN
    data: dict[str, Any] = {name: ns / 1e6 / children for name, ns in total.most_common()}
    data["total_ms_per_child"] = sum(total.values()) / 1e6 / children
    data["load"] = os.getloadavg()[0]
    lines = ["| thread | CPU ms per child |", "|---|---|"]
    lines += [f"| {name} | {ns / 1e6 / children:.3f} |" for name, ns in total.most_common() if ns]
    lines += [f"| all | {data['total_ms_per_child']:.3f} |", "", f"Load (1 min) at the end: {data['load']:.1f}."]
    if top:
        data["event_loop_top"] = top
        lines += ["", "| event loop function (cProfile, own time) | µs per child, inflated | calls per child |"]
        lines += ["|---|---|---|", *(f"| `{name}` | {us:.0f} | {calls:.1f} |" for name, us, calls in top)]
    write_results(args.name, data, "\n".join(lines))


def ranked(profile: Path, children: int) -> list[tuple[str, float, float]]:
    """The event loop's 25 functions of most own time: (name, µs per child, calls per child)."""
    stats: dict[Any, Any] = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    rows = [
        (f"{Path(file).name}:{line}({name})", own * 1e6 / children, calls / children)
        for (file, line, name), (calls, _, own, _, _) in stats.items()
    ]
    return sorted(rows, key=lambda row: -row[1])[:25]


if __name__ == "__main__":
    asyncio.run(main())
