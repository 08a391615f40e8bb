"""The gateway's CPU per warm create with a policy and a bound secret, the vault read back at the
activation (as now) against handed over in memory (`handover_gateway.py`), in turns on one
gateway, with a policy alone as the reference; by thread as in `secret_cpu.py`.

    python bench/investigations/egress-streams/handover_ab.py --creates 100 [--out NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from egress import _on_cpu_ms
from harness import gateway_process
from secret_cpu import HERE, pool_files, specs
from warm_path import wait_idle

KINDS = ("policy", "vault", "handed")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=100)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    made = specs()
    kinds = {"policy": made["policy"], "vault": made["bound"], "handed": made["bound"]}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        pools, config = pool_files(Path(tmp))
        async with gateway_process(
            "--pools", str(pools), "--config", str(config), entry=HERE / "handover_gateway.py"
        ) as gw:
            await wait_idle(gw, "egress", 2, timeout=300)
            for i in range(-1, args.creates):
                order = KINDS[i % 3 :] + KINDS[: i % 3]
                for kind in order if i % 2 == 0 else order[::-1]:
                    await wait_idle(gw, "egress", 2)
                    os.kill(gw.process.pid, signal.SIGUSR1 if kind == "handed" else signal.SIGUSR2)
                    await asyncio.sleep(0.01)
                    start = _on_cpu_ms(gw.process.pid)
                    await gw.create_ready(name=f"{kind}-{i}", spec=kinds[kind])
                    if i >= 0:
                        cpu[kind].append(_on_cpu_ms(gw.process.pid) - start)
                    await gw.delete(f"{kind}-{i}")
                if i % 10 == 0:
                    loads.append(os.getloadavg()[0])
    p50 = {kind: statistics.median(cpu[kind]) for kind in KINDS}
    pairs = sorted(h / v for v, h in zip(cpu["vault"], cpu["handed"], strict=True))
    text = (
        f"handover_ab.py --creates {args.creates}; 1-minute load {min(loads):.1f}-{max(loads):.1f}\n"
        f"CPU per create p50: policy {p50['policy']:.3f} ms, bound secret read from the vault "
        f"{p50['vault']:.3f} (+{p50['vault'] - p50['policy']:.3f}), handed over "
        f"{p50['handed']:.3f} (+{p50['handed'] - p50['policy']:.3f}); handed - vault "
        f"{p50['handed'] - p50['vault']:+.3f} ms, pairs' ratios p50 {statistics.median(pairs):.3f}"
    )
    print(text)
    if args.out:
        (HERE / "results" / f"{args.out}.txt").write_text(text + "\n")


if __name__ == "__main__":
    asyncio.run(main())
