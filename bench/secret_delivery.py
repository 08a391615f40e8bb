"""Issue 16 benchmark: warm create -> Ready on the local driver with and without per-request
values, in one run against one pool.

The pool bakes `POOL=secrets` and accepts `TASK_*`. Plain creates ask for `POOL=secrets` only;
loaded creates add 5 accepted `TASK_*` keys (left out of the match, set at activation) and 10
secrets (sealed into the store at create, opened at activation). The two kinds alternate, so
drift on a shared machine falls on both alike; before each create the script waits (untimed)
for an idle member, so every sample is a hit.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from harness import GatewayProcess, create_latency_table, gateway_process, summary, write_results
from warm_path import wait_idle

from warmshell.api.v1 import sandbox_pb2 as pb

BAKED = {"POOL": "secrets"}
INJECTED = {f"TASK_{i}": f"value-{i}" for i in range(5)}
SECRETS = {f"SECRET_{i}": f"s3cr3t-{i}-" + "x" * 32 for i in range(10)}


def write_profile(directory: Path, replicas: int) -> None:
    text = (
        f'version = 1\nworkspace = "default"\nreplicas = {replicas}\n'
        '[environment]\nPOOL = "secrets"\n[activation]\nenvironment = ["TASK_*"]\n'
    )
    (directory / "secrets.toml").write_text(text)


async def timed(gw: GatewayProcess, name: str, spec: pb.SandboxSpec) -> tuple[float, float, str]:
    start = time.perf_counter()
    await gw.create(name=name, spec=spec)
    ready = await gw.wait_ready(name)
    client_ms = (time.perf_counter() - start) * 1000
    timeline = ready.status.timeline
    await gw.delete(name)
    return client_ms, (timeline.ready_us - timeline.requested_us) / 1000, ready.status.allocation


async def measure(count: int, pool_size: int) -> dict:
    specs = {
        "plain": pb.SandboxSpec(environment=BAKED),
        "loaded": pb.SandboxSpec(environment={**BAKED, **INJECTED}, secrets=SECRETS),
    }
    samples: dict[str, dict[str, list[float]]] = {k: {"client": [], "server": []} for k in specs}
    allocations: dict[str, dict[str, int]] = {k: {"warm": 0, "cold": 0} for k in specs}
    with tempfile.TemporaryDirectory(prefix="ws-secrets-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        write_profile(pools, pool_size)
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"[local]\nmax_pool_replicas = {pool_size}\n")
        async with gateway_process("--pools", str(pools), "--config", str(config)) as gw:
            await wait_idle(gw, "secrets", pool_size, timeout=300)
            for i in range(count):
                for kind, spec in specs.items():
                    await wait_idle(gw, "secrets", 1)
                    client, server, allocation = await timed(gw, f"{kind}-{i}", spec)
                    samples[kind]["client"].append(client)
                    samples[kind]["server"].append(server)
                    allocations[kind][allocation] += 1
    return {
        kind: {
            "client_ms": summary(samples[kind]["client"]),
            "server_ms": summary(samples[kind]["server"]),
            "allocations": allocations[kind],
        }
        for kind in specs
    } | {"pool_size": pool_size, "injected_keys": len(INJECTED), "secrets": len(SECRETS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=50, help="creates of each kind")
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--name", default="secret_delivery", help="results file name under bench/results/")
    args = parser.parse_args()
    data = asyncio.run(measure(args.count, args.pool_size))
    plain, loaded = data["plain"], data["loaded"]
    data["loaded_minus_plain_p50_ms"] = {
        view: loaded[view]["p50"] - plain[view]["p50"] for view in ("client_ms", "server_ms")
    }
    table = create_latency_table((("plain", plain), ("10 secrets + 5 injected keys", loaded)), first_column="create")
    diff = data["loaded_minus_plain_p50_ms"]
    table += (
        f"\nLoaded minus plain, p50: **{diff['client_ms']:+.2f} ms** client, {diff['server_ms']:+.2f} ms server "
        "(target: within 1 ms). Alternating creates in one run on a shared machine.\n"
    )
    write_results(args.name, data, table)


if __name__ == "__main__":
    main()
