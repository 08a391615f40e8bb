"""CPU per connection setup through the proxy, by part: the sandbox's agent (its own time, not
its children's), the gateway (every thread) and the client; `--connects` CONNECT setups from
inside a sandbox (the client of `bench/egress.py`), alternating whole runs of an older tree
(`--before-src`, its agent built) and this one.

    python bench/investigations/egress-streams/setup_cpu.py --connects 2000 --rounds 2 --before-src DIR
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from egress import UPSTREAM, _agents, _cpu_seconds, _on_cpu_ms, _sandbox_run
from harness import gateway_process
from warm_path import wait_idle

from warmshell.api.v1 import sandbox_pb2 as pb


async def run(connects: int, src: Path | None) -> dict[str, float]:
    """One gateway: CPU microseconds per setup of the agent and the gateway, and the p50 setup."""
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True)
    assert upstream.stdout is not None
    authority = f"127.0.0.2:{upstream.stdout.readline().strip()}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pools = Path(tmp) / "pools"
            pools.mkdir()
            (pools / "egress.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\nimage = ""\n')
            config = Path(tmp) / "gateway.toml"
            config.write_text("[network]\nrequests_may_widen = true\nmax_connections = 100000\n")
            async with gateway_process("--pools", str(pools), "--config", str(config), src=src) as gw:
                await wait_idle(gw, "egress", 1, timeout=300)
                await gw.create_ready(name="bench", spec=pb.SandboxSpec(network=pb.NetworkPolicy(allow=[authority])))
                await _sandbox_run(gw, "bench", "setup-proxy", authority, "20", "1")  # warm-up
                agents = _agents(gw.process.pid)
                agent_before = sum(_cpu_seconds(f"/proc/{pid}/stat") for pid in agents)
                gateway_before = _on_cpu_ms(gw.process.pid)
                times = (await _sandbox_run(gw, "bench", "setup-proxy", authority, str(connects), "1"))["ms"]
                gateway = _on_cpu_ms(gw.process.pid) - gateway_before
                agent = sum(_cpu_seconds(f"/proc/{pid}/stat") for pid in agents) - agent_before
    finally:
        upstream.terminate()
        upstream.wait()
    return {
        "agent_us": agent * 1e6 / connects,
        "gateway_us": gateway * 1e3 / connects,
        "p50_ms": statistics.median(times),
        "load": os.getloadavg()[0],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before-src", type=Path, required=True)
    args = parser.parse_args()
    for number in range(args.rounds):
        for label in ("before", "after") if number % 2 == 0 else ("after", "before"):
            found = await run(args.connects, args.before_src if label == "before" else None)
            print(
                f"{label}: agent {found['agent_us']:.1f} us, gateway {found['gateway_us']:.1f} us CPU per setup; "
                f"setup p50 {found['p50_ms']:.3f} ms; load {found['load']:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
