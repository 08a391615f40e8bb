"""The gateway's CPU per warm create with a policy (`--allow-net` one IP rule) and without,
alternating on one gateway, the whole pool idle before each create; and over each whole cycle
(create, delete, the pool's refill). `SRC`: run the warmshell package under that directory.

    python bench/investigations/egress-streams/create_cpu_ab.py COUNT [SRC]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from egress import _on_cpu_ms
from harness import gateway_process
from warm_path import wait_idle

from warmshell.api.v1 import sandbox_pb2 as pb


async def main(count: int, src: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        (pools / "egress.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 2\nimage = ""\n')
        config = Path(tmp) / "gateway.toml"
        config.write_text("[network]\nrequests_may_widen = true\n")
        async with gateway_process("--pools", str(pools), "--config", str(config), src=src) as gw:
            await wait_idle(gw, "egress", 2, timeout=300)
            policy = pb.SandboxSpec(network=pb.NetworkPolicy(allow=["127.0.0.2:8080"]))
            specs = {"plain": pb.SandboxSpec(), "policy": policy}
            window: dict[str, list[float]] = {kind: [] for kind in specs}
            cycle = dict.fromkeys(specs, 0.0)
            for i in range(count):
                for kind in list(specs) if i % 2 == 0 else list(specs)[::-1]:
                    await wait_idle(gw, "egress", 2)
                    start = _on_cpu_ms(gw.process.pid)
                    await gw.create_ready(name=f"{kind}-{i}", spec=specs[kind])
                    window[kind].append(_on_cpu_ms(gw.process.pid) - start)
                    await gw.delete(f"{kind}-{i}")
                    await wait_idle(gw, "egress", 2)
                    cycle[kind] += _on_cpu_ms(gw.process.pid) - start
    plain, with_policy = statistics.median(window["plain"]), statistics.median(window["policy"])
    print(
        f"create, p50 ms: {plain:.3f} without, {with_policy:.3f} with a policy: {with_policy / plain:.3f}x "
        f"({with_policy - plain:+.3f} ms); whole cycle, mean: {cycle['plain'] / count:.3f}, "
        f"{cycle['policy'] / count:.3f}: {cycle['policy'] / cycle['plain']:.3f}x; load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None))
