"""Issue 13 soak: mixed create/exec/delete by well-behaved clients, first alone (quiet), then
beside hostile sandboxes (disk fill of their tmpfs, a fork bomb bounded by the process limit, an
output flood read by a client), in one gateway and one invocation. Reports the well-behaved
clients' create -> Ready and exec latency p50/p99 in both phases and their lost outputs (every
exec's output is checked byte for byte).

    python bench/soak.py --seconds 600   # the issue's 10 minutes per phase

Run as root (the process bound needs a uid per sandbox).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import time

from harness import GatewayProcess, gateway_process, summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb

OUTPUT_BYTES = 200_000
HOSTILE = {
    "disk-fill": "while :; do dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; rm -f /tmp/fill; done",
    "fork-bomb": "while :; do sleep 5 & done",
    "output-flood": "cat /dev/zero",
}


async def exec_all(gw: GatewayProcess, name: str, script: str, timeout: int = 0) -> tuple[int, bytes]:
    out, code = bytearray(), -1
    request = pb.ExecSandboxRequest(name=name, command=["/bin/sh", "-c", script], timeout_seconds=timeout)
    async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
        kind = event.WhichOneof("event")
        if kind == "stdout":
            out += event.stdout
        elif kind == "exit_code":
            code = event.exit_code
    return code, bytes(out)


async def well_behaved(gw: GatewayProcess, worker: int, until: float, stats: dict[str, list[float]]) -> None:
    round_ = 0
    while time.monotonic() < until:
        name = f"w{worker}-{round_}"
        round_ += 1
        start = time.perf_counter()
        await gw.create(name=name)
        await gw.wait_ready(name)
        stats["create_ready_ms"].append((time.perf_counter() - start) * 1000)
        nonce = secrets.token_hex(8)
        start = time.perf_counter()
        code, out = await exec_all(gw, name, f"printf {nonce}; head -c {OUTPUT_BYTES} /dev/zero")
        stats["exec_ms"].append((time.perf_counter() - start) * 1000)
        expected = nonce.encode() + bytes(OUTPUT_BYTES)
        stats["lost"].append(0.0 if (code, out) == (0, expected) else 1.0)
        await gw.delete(name)


async def hostile(gw: GatewayProcess, name: str, script: str) -> None:
    """Keep the attack running (re-run when its exec ends) until cancelled."""
    while True:
        with contextlib.suppress(Exception):
            request = pb.ExecSandboxRequest(name=name, command=["/bin/sh", "-c", script], timeout_seconds=60)
            async for _ in gw.stub.ExecSandbox(request, metadata=gw.metadata):
                pass
        await asyncio.sleep(0.1)


async def phase(gw: GatewayProcess, seconds: float, workers: int) -> dict[str, list[float]]:
    stats: dict[str, list[float]] = {"create_ready_ms": [], "exec_ms": [], "lost": []}
    until = time.monotonic() + seconds
    await asyncio.gather(*(well_behaved(gw, w, until, stats) for w in range(workers)))
    return stats


async def main(seconds: float, workers: int) -> None:
    async with gateway_process() as gw:
        quiet = await phase(gw, seconds, workers)
        for name in HOSTILE:
            await gw.create(name=name)
            await gw.wait_ready(name)
        attacks = [asyncio.create_task(hostile(gw, name, script)) for name, script in HOSTILE.items()]
        await asyncio.sleep(2)  # let the attacks reach their bounds
        try:
            loud = await phase(gw, seconds, workers)
        finally:
            for task in attacks:
                task.cancel()
            await asyncio.gather(*attacks, return_exceptions=True)
            for name in HOSTILE:
                with contextlib.suppress(Exception):
                    await gw.delete(name)
    data = {
        "seconds_per_phase": seconds,
        "workers": workers,
        "quiet": {k: summary(v) for k, v in quiet.items() if k != "lost"},
        "hostile": {k: summary(v) for k, v in loud.items() if k != "lost"},
        "lost_outputs": {"quiet": int(sum(quiet["lost"])), "hostile": int(sum(loud["lost"]))},
        "execs": {"quiet": len(quiet["lost"]), "hostile": len(loud["lost"])},
    }
    rows = ["| metric | quiet p50 | quiet p99 | hostile p50 | hostile p99 | p50 ratio |", "|---|---|---|---|---|---|"]
    for metric in ("create_ready_ms", "exec_ms"):
        q, h = data["quiet"][metric], data["hostile"][metric]
        cells = [q["p50"], q["p99"], h["p50"], h["p99"]]
        rows.append(f"| {metric} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {h['p50'] / q['p50']:.2f} |")
    lost, execs = data["lost_outputs"], data["execs"]
    rows.append("")
    rows.append(
        f"Lost outputs: {lost['quiet']} of {execs['quiet']} (quiet), "
        f"{lost['hostile']} of {execs['hostile']} (hostile). "
        f"{workers} well-behaved workers, {seconds:g}s per phase; hostile: {', '.join(HOSTILE)}. Shared machine."
    )
    write_results("soak", data, "\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="length of each phase")
    parser.add_argument("--workers", type=int, default=3, help="well-behaved clients")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.workers))
