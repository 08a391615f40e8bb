"""Issue 12 benchmark: the public API's latency while a workload loops RegisterSupervisor with its
pod's stolen projected token, on the Kubernetes driver against kubesim.

kubesim runs as a child process, the gateway in this one (as in `kubernetes_cold.py`). One cold
sandbox is made Ready; its token is read from inside the pod (`exec cat`, what the workload can
do). Then, for each configuration, GetSandbox is timed sequentially: quiet, and while an attacker
process loops RegisterSupervisor with that token as fast as it can (`--streams` concurrent
calls over one channel). Configurations: the default rate limits, and the limits raised out of reach (what
the loop costs when only the live-session refusal stands in its way: every attempt pays a
TokenReview and two cluster reads). Reported: GetSandbox p50/p99 per phase, the ratio to quiet,
the attacker's attempts/s and the outcomes it saw (none may be an activation).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import summary, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.gateway import RunningGateway, running_gateway  # noqa: E402
from tests.helpers.kubesim_process import kubesim_process  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import gateway_settings  # noqa: E402
from warmshell.drivers.kubernetes import rendering  # noqa: E402

LOOP = r"""
import asyncio, collections, json, sys, time
import grpc
from warmshell.api.v1 import supervisor_pb2 as spb, supervisor_pb2_grpc

async def main(address, token, seconds, streams):
    outcomes = collections.Counter()
    deadline = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(address) as channel:
        stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
        request = spb.RegisterSupervisorRequest(bootstrap_credential=token)
        async def loop():
            while time.monotonic() < deadline:
                try:
                    async for _ in stub.RegisterSupervisor(request):
                        outcomes["ACTIVATED"] += 1
                        break
                except grpc.aio.AioRpcError as exc:
                    outcomes[exc.code().name] += 1
        await asyncio.gather(*(loop() for _ in range(streams)))
    print(json.dumps({"outcomes": outcomes, "per_second": sum(outcomes.values()) / seconds}))

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
"""

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "limits on (default: 1 s refusal delay)": {},
    "limits on, no refusal delay": {"rate_limits.refusal_delay_seconds": 0.0},
    "limits off": {"rate_limits.registration.per_second": 1e9, "rate_limits.registration.burst": 10**9},
}


async def timed_gets(gw: RunningGateway, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await gw.get("victim")
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def phase(gw: RunningGateway, token: str, gets: int, *, flood: bool, streams: int = 0) -> dict[str, Any]:
    if not flood:
        return {"get_ms": summary(await timed_gets(gw, gets))}
    address = gw.gateway.config.kubernetes.gateway_address
    seconds = 3.0 + gets / 200  # outlasts the timed GetSandbox calls
    attacker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOOP, address, token, str(seconds), str(streams), stdout=asyncio.subprocess.PIPE
    )
    await asyncio.sleep(1.0)  # let the loop reach its pace
    samples = await timed_gets(gw, gets)
    out, _ = await attacker.communicate()
    loop = json.loads(out)
    return {"get_ms": summary(samples), "attacker": loop}


async def measure(gets: int, streams: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, overrides in CONFIGURATIONS.items():
        async with kubesim_process() as cluster:
            with tempfile.TemporaryDirectory(prefix="ws-flood-bench-") as tmp:
                state = Path(tmp) / "state"
                settings = gateway_settings(cluster, state) | {"reconcile_interval_seconds": 10.0} | overrides  # type: ignore[arg-type]
                async with running_gateway(state, **settings) as gw:
                    await gw.create(name="victim")
                    await gw.wait_ready("victim", timeout=60)
                    code, token, _ = await gw.exec("victim", ["cat", rendering.TOKEN_PATH])
                    assert code == 0, "the workload could not read its pod's token"
                    await timed_gets(gw, 50)  # warm-up
                    quiet = await phase(gw, token.decode().strip(), gets, flood=False)
                    flooded = await phase(gw, token.decode().strip(), gets, flood=True, streams=streams)
                    code, out, _ = await gw.exec("victim", ["echo", "REAL"])
                    results[label] = {"quiet": quiet, "flood": flooded, "exec_after": [code, out.decode()]}
                    await gw.delete("victim")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gets", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=16, help="concurrent RegisterSupervisor loops")
    args = parser.parse_args()
    data = {"gets": args.gets, "streams": args.streams, "configurations": asyncio.run(measure(args.gets, args.streams))}
    table = (
        "| configuration | phase | GetSandbox p50 ms | p99 ms | p50 / quiet | attacker attempts/s | outcomes |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    for label, run in data["configurations"].items():
        quiet = run["quiet"]["get_ms"]
        for name in ("quiet", "flood"):
            ms = run[name]["get_ms"]
            attacker = run[name].get("attacker")
            rate = f"{attacker['per_second']:.0f}" if attacker else "-"
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(attacker["outcomes"].items())) if attacker else "-"
            table += (
                f"| {label} | {name} | {ms['p50']:.2f} | {ms['p99']:.2f} | {ms['p50'] / quiet['p50']:.2f} "
                f"| {rate} | {outcomes} |\n"
            )
    table += (
        f"\nThe attacker is a separate process looping RegisterSupervisor ({data['streams']} concurrent "
        "streams) with the pod's own projected token while the pod's real supervisor holds a live "
        "session. No outcome may be ACTIVATED. The machine was shared with other work: read the "
        "ratios, not the absolute figures.\n"
    )
    write_results("register_flood", data, table)


if __name__ == "__main__":
    main()
