"""Issue 20: a pod supervisor's memory while its gateway keeps GOAWAYing and dropping it.

    python bench/investigations/supervisor-memory/supervisor_memory.py [--seconds 8] [--rounds 3]
        [--max-age-ms 1] [--mode abort|goaway] [--before-src DIR] [--env K=V ...]

A real `python -m warmshell supervisor` process (as a pod runs it) connects over TCP loopback to
a stand-in gateway in this process (`tests/helpers/churning_gateway.py`) that activates it at
once and ends every session after one heartbeat round trip: `abort` aborts it with UNAVAILABLE,
`goaway` stops the server and starts a new one on the same port (a replica replaced). With
`--max-age-ms N` (default 1) the server also GOAWAYs every connection N ms after it is made, as
a replica that is shutting down does; `--max-age-ms 0` turns that off.

After the supervisor's first session the clock runs `--seconds`; its RSS and Private_Dirty
(`/proc/<pid>/smaps_rollup`) and the sessions so far are read at the start, the half and the
end. The figure is the growth over the second half (the first includes warm-up). Each round runs
this tree and, with `--before-src DIR` (a `src/` from `git archive <commit> src`), that one,
alternating. `--env MALLOC_ARENA_MAX=1` etc. run the supervisor under another allocator
setting, to tell fragmentation from a leak. Results: `results/<--name>.{json,md}` beside this script
(default `supervisor_memory`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.helpers.churning_gateway import (  # noqa: E402
    ChurningGateway,
    free_port,
    memory_kib,
    serve,
    start_supervisor,
    stop,
)

RESULTS = Path(__file__).parent / "results"


async def run(
    mode: str, seconds: float, max_age_ms: int, extra_env: dict[str, str], python: str, src: str | None
) -> dict[str, Any]:
    """One supervisor against the stand-in for `seconds`; its memory at the start, half and end."""
    gateway = ChurningGateway(mode)
    port = free_port()
    server = await serve(gateway, port, max_age_ms)
    env = {**({"PYTHONPATH": src} if src else {}), **extra_env}
    with tempfile.TemporaryDirectory(prefix="ws-supmem-") as tmp:
        process = start_supervisor(port, Path(tmp), extra_env=env, python=python)
        samples: list[dict[str, int]] = []
        try:
            async with asyncio.timeout(60):
                await gateway.session_started.wait()  # started, registered, activated
            started = time.monotonic()
            samples.append({"sessions": gateway.sessions, **memory_kib(process.pid)})
            for deadline in (seconds / 2, seconds):
                while (left := deadline - (time.monotonic() - started)) > 0:
                    if mode != "goaway":
                        await asyncio.sleep(min(0.2, left))
                        continue
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await gateway.heartbeat_answered.wait()
                    if gateway.heartbeat_answered.is_set():
                        gateway.heartbeat_answered.clear()
                        await stop(server, gateway)
                        server = await serve(gateway, port, max_age_ms)
                samples.append({"sessions": gateway.sessions, **memory_kib(process.pid)})
            assert process.poll() is None, f"the supervisor exited with {process.returncode}"
        finally:
            process.kill()
            process.wait()
            await stop(server, gateway)
    first, half, end = samples
    return {
        "mode": mode,
        "tree": "before" if src else "this",
        "max_age_ms": max_age_ms,
        "env": extra_env,
        "seconds": seconds,
        "sessions": [first["sessions"], half["sessions"], end["sessions"]],
        "rss_kib": [first["Rss"], half["Rss"], end["Rss"]],
        "second_half_growth_kib": end["Private_Dirty"] - half["Private_Dirty"],
        "loadavg": Path("/proc/loadavg").read_text().split()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("abort", "goaway"), default="abort")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-age-ms", type=int, default=1, help="the server GOAWAYs every connection after this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-src", help="a source tree (its src/) to alternate with this one")
    parser.add_argument("--env", action="append", default=[], help="K=V for the supervisor's environment")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--name", default="supervisor_memory", help="writes results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    trees: list[str | None] = [None, *([args.before_src] if args.before_src else [])]
    results = []
    for _ in range(args.rounds):
        for tree in trees:
            result = asyncio.run(run(args.mode, args.seconds, args.max_age_ms, extra, args.python, tree))
            print(json.dumps(result), flush=True)
            results.append(result)
    command = "python bench/investigations/supervisor-memory/supervisor_memory.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"command": command, "runs": results}, indent=2))
    lines = [
        f"`{command}` (machine shared with other work; load average per run)",
        "",
        "| tree | sessions (start/half/end) | RSS MiB (start/half/end) | 2nd-half growth MiB | load |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        rss = "/".join(f"{kib / 1024:.0f}" for kib in r["rss_kib"])
        sessions = "/".join(str(n) for n in r["sessions"])
        growth = r["second_half_growth_kib"] / 1024
        lines.append(f"| {r['tree']} | {sessions} | {rss} | {growth:.1f} | {r['loadavg']} |")
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
