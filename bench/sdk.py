"""Issue 15 benchmark: what the Python SDK adds over the raw gRPC stubs, in one run against one
gateway process (local driver): warm create -> Ready, and the `run(["true"])` round trip. Issue 33
adds the byte path (`sdk_transfers.py`): one 5 MiB transfer each way and a 13-file bulk upload,
before/after in the same run with `--before-src`; and the harness fan-out (`sdk_fanout.py`): 50
episodes at once (`--fanout-only` measures it alone, keeping the other figures of the last run).

Four clients are measured side by side, interleaved sample by sample so drift in a shared
machine hits them alike: the raw sync stubs, `warmshell.Client`, the raw grpc.aio stubs, and
`warmshell.AsyncClient`. The raw create is what the SDK does on the wire (CreateSandbox, then
WatchSandbox until Ready); the raw exec reads the ExecSandbox stream to its exit code. Creates
match a pool sized for the run; before each round the script waits (untimed) for an idle member.
Exec rounds rotate which client goes first. The SDK's overhead is reported as the median of
the paired differences (SDK minus raw, same round) beside the difference of the p50s; the issue
allows 0.3 ms. Because round trips on a shared machine vary by more than that, the script also
times the work the SDK adds per call on its own (request building and reply conversion, no I/O).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from harness import GatewayProcess, gateway_process, summary, write_results
from sdk_fanout import fanout_table, measure_fanout
from sdk_transfers import measure_transfers, transfers_table
from warm_path import wait_idle, write_profile

import warmshell
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.sdk import calls, views

ENV = {"POOL": "sdk"}
KINDS = ("raw sync", "sdk sync", "raw async", "sdk async")


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def raw_create(stub: sandbox_pb2_grpc.SandboxServiceStub, metadata: tuple[tuple[str, str], ...], name: str) -> float:
    start = time.perf_counter()
    stub.CreateSandbox(pb.CreateSandboxRequest(name=name, spec=pb.SandboxSpec(environment=ENV)), metadata=metadata)
    request = pb.WatchSandboxRequest(name=name, stop_on_ready=True, stop_on_terminal=True)
    for event in stub.WatchSandbox(request, metadata=metadata):
        if event.HasField("sandbox") and event.sandbox.status.phase == pb.SANDBOX_PHASE_READY:
            break
    return _ms(start)


async def raw_create_async(gw: GatewayProcess, name: str) -> float:
    start = time.perf_counter()
    await gw.create(name=name, spec=pb.SandboxSpec(environment=ENV))
    await gw.wait_ready(name)
    return _ms(start)


def raw_exec(stub: sandbox_pb2_grpc.SandboxServiceStub, metadata: tuple[tuple[str, str], ...], name: str) -> float:
    start = time.perf_counter()
    for event in stub.ExecSandbox(pb.ExecSandboxRequest(name=name, command=["true"]), metadata=metadata):
        if event.HasField("exit_code"):
            assert event.exit_code == 0
    return _ms(start)


async def raw_exec_async(gw: GatewayProcess, name: str) -> float:
    start = time.perf_counter()
    async for event in gw.stub.ExecSandbox(pb.ExecSandboxRequest(name=name, command=["true"]), metadata=gw.metadata):
        if event.HasField("exit_code"):
            assert event.exit_code == 0
    return _ms(start)


def _rotated(i: int) -> tuple[str, ...]:
    """KINDS starting at a different one each round, so no client always goes first."""
    return KINDS[i % len(KINDS) :] + KINDS[: i % len(KINDS)]


def client_cpu_us(count: int) -> dict[str, float]:
    """What the SDK computes per call that raw stubs do not (building the request, converting the
    replies), without any I/O: microseconds per call, p50 of `count`."""
    reply = pb.Sandbox(name="b", status=pb.SandboxStatus(phase=pb.SANDBOX_PHASE_READY, allocation="warm"))
    exit_event = pb.ExecEvent(exit_code=0)

    def create_work() -> None:
        calls.create_request(
            name="b", workspace="", image="", env=ENV, cpu="", memory="", command=None, labels=None,
            ttl_seconds=None, idle_timeout_seconds=None,
        )  # fmt: skip
        fold = calls.ReadyFold(reply)
        fold.done()
        views.sandbox_info(reply)
        views.sandbox_info(fold.last)

    def run_work() -> None:
        calls.exec_request(name="b", workspace="", argv=["true"], env=None, workdir=None, timeout=None, stdin=b"")
        fold = calls.ExecFold()
        fold.feed(exit_event)
        fold.result(0.0)

    result = {}
    for label, work in (("create", create_work), ("run", run_work)):
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            work()
            samples.append((time.perf_counter() - start) * 1e6)
        result[label] = statistics.median(samples)
    return result


def overhead(samples: dict[str, list[float]], raw: str, sdk: str) -> dict[str, float]:
    paired = [s - r for r, s in zip(samples[raw], samples[sdk], strict=True)]
    return {
        "median_paired_ms": statistics.median(paired),
        "p50_difference_ms": statistics.median(samples[sdk]) - statistics.median(samples[raw]),
    }


async def measure(creates: int, execs: int, pool_size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ws-sdk-bench-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        write_profile(pools, "sdk", pool_size, ENV)
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"[local]\nmax_pool_replicas = {pool_size}\n")
        async with gateway_process("--pools", str(pools), "--config", str(config)) as gw:
            address = f"unix://{gw.state / 'gateway.sock'}"
            channel = grpc.insecure_channel(address)
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            sync_sdk = warmshell.Client(state_dir=gw.state)
            async_sdk = warmshell.AsyncClient(state_dir=gw.state)
            try:
                await wait_idle(gw, "sdk", pool_size)
                create_ms, allocations = await _creates(gw, stub, sync_sdk, async_sdk, creates)
                exec_ms = await _execs(gw, stub, sync_sdk, async_sdk, execs)
            finally:
                sync_sdk.close()
                await async_sdk.close()
                channel.close()
    return {
        "sdk_client_cpu_us_p50": client_cpu_us(10_000),
        "pool_size": pool_size,
        "allocations": allocations,
        "create_ready_ms": {k: summary(v) for k, v in create_ms.items()},
        "run_true_ms": {k: summary(v) for k, v in exec_ms.items()},
        "sdk_overhead_ms": {
            "create_sync": overhead(create_ms, "raw sync", "sdk sync"),
            "create_async": overhead(create_ms, "raw async", "sdk async"),
            "run_sync": overhead(exec_ms, "raw sync", "sdk sync"),
            "run_async": overhead(exec_ms, "raw async", "sdk async"),
        },
    }


async def _creates(
    gw: GatewayProcess,
    stub: sandbox_pb2_grpc.SandboxServiceStub,
    sync_sdk: warmshell.Client,
    async_sdk: warmshell.AsyncClient,
    rounds: int,
) -> tuple[dict[str, list[float]], dict[str, int]]:
    samples: dict[str, list[float]] = {k: [] for k in KINDS}
    allocations: dict[str, int] = {}
    for i in range(rounds):
        names = [f"{kind.replace(' ', '-')}-{i}" for kind in KINDS]
        for kind, name in zip(KINDS, names, strict=True):  # creates stay in order: pool state moves
            await wait_idle(gw, "sdk", 1)  # untimed: every sample measures a pool hit
            if kind == "raw sync":
                samples[kind].append(raw_create(stub, gw.metadata, name))
            elif kind == "sdk sync":
                start = time.perf_counter()
                sync_sdk.create(name=name, env=ENV)
                samples[kind].append(_ms(start))
            elif kind == "raw async":
                samples[kind].append(await raw_create_async(gw, name))
            else:
                start = time.perf_counter()
                await async_sdk.create(name=name, env=ENV)
                samples[kind].append(_ms(start))
        for name in names:
            ready = await gw.stub.GetSandbox(pb.SandboxRef(name=name), metadata=gw.metadata)
            allocations[ready.status.allocation] = allocations.get(ready.status.allocation, 0) + 1
            await gw.delete(name)
    return samples, allocations


async def _execs(
    gw: GatewayProcess,
    stub: sandbox_pb2_grpc.SandboxServiceStub,
    sync_sdk: warmshell.Client,
    async_sdk: warmshell.AsyncClient,
    rounds: int,
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in KINDS}
    await wait_idle(gw, "sdk", 1)
    sync_box = sync_sdk.create(name="exec-box", env=ENV)
    async_box = await async_sdk.get("exec-box")

    def sdk_exec() -> float:
        start = time.perf_counter()
        assert sync_box.run(["true"]).exit_code == 0
        return _ms(start)

    timed: dict[str, Callable[[], float]] = {
        "raw sync": lambda: raw_exec(stub, gw.metadata, "exec-box"),
        "sdk sync": sdk_exec,
    }
    for i in range(rounds):
        for kind in _rotated(i):
            if kind in timed:
                samples[kind].append(timed[kind]())
            elif kind == "raw async":
                samples[kind].append(await raw_exec_async(gw, "exec-box"))
            else:
                start = time.perf_counter()
                await async_box.run(["true"])
                samples[kind].append(_ms(start))
    sync_box.delete()
    return samples


def render(data: dict) -> str:
    """The markdown of a run's figures (`data` as written to sdk.json)."""
    table = "| measure | client | n | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|---|---|\n"
    for label, key in (("create -> Ready (warm)", "create_ready_ms"), ('run(["true"])', "run_true_ms")):
        for kind in KINDS:
            s = data[key][kind]
            table += f"| {label} | {kind} | {s['n']} | {s['p50']:.3f} | {s['p90']:.3f} | {s['p99']:.3f} |\n"
    table += "\n| SDK overhead | median of paired differences ms | difference of p50s ms |\n|---|---|---|\n"
    for label, o in data["sdk_overhead_ms"].items():
        table += f"| {label} | {o['median_paired_ms']:+.3f} | {o['p50_difference_ms']:+.3f} |\n"
    worst = max(o["median_paired_ms"] for o in data["sdk_overhead_ms"].values())
    cpu = data["sdk_client_cpu_us_p50"]
    table += (
        f"\nCPU the SDK adds per call, without I/O (p50 of 10,000): create {cpu['create']:.1f} us, "
        f"run {cpu['run']:.1f} us.\n"
    )
    table += (
        f"\nLargest SDK overhead (median of paired differences): **{worst:+.3f} ms** (allowed 0.3 ms). "
        f"Creates served: {data['allocations']}. Measured on a machine shared with other work.\n"
    )
    table += "\n## The byte path (issue 33)\n" + transfers_table(data["transfers"])
    if "fanout" in data:
        table += "\n## The harness fan-out (issue 33)\n\n" + fanout_table(data["fanout"])
    if "fanout_grpc" in data:
        table += (
            "\nThe same fan-out with the gateway's byte stream off (`[files] transfer_stream = false`), after it:\n\n"
        )
        table += fanout_table(data["fanout_grpc"])
        if earlier := data.get("other_figures_from"):
            table += f"\nThe figures above the fan-out are from the earlier run of {earlier}.\n"
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=60, help="rounds of four creates")
    parser.add_argument("--execs", type=int, default=300, help="rounds of four run(['true'])")
    parser.add_argument("--pool-size", type=int, default=24)
    parser.add_argument("--transfer-rounds", type=int, default=20, help="rounds of the byte-path figures")
    parser.add_argument("--before-src", type=Path, help="an older tree's src/ for the byte path's before column")
    parser.add_argument("--fanout-episodes", type=int, default=50, help="episodes at once in the harness fan-out")
    parser.add_argument("--fanout-rounds", type=int, default=3)
    parser.add_argument(
        "--fanout-only",
        action="store_true",
        help="measure only the fan-out; the other figures are kept from results/sdk.json (and said to be)",
    )
    parser.add_argument(
        "--fanout-grpc", action="store_true", help="then the fan-out again with the byte stream off (gRPC messages)"
    )
    args = parser.parse_args()
    if args.fanout_only:
        earlier = json.loads((Path(__file__).resolve().parent / "results" / "sdk.json").read_text())
        data = {
            k: v
            for k, v in earlier.items()
            if k not in ("command", "date", "machine", "other_figures_from", "fanout_grpc")
        }
        data["other_figures_from"] = f"{earlier['date']} (`{earlier['command']}`)"
    else:
        data = asyncio.run(measure(args.creates, args.execs, args.pool_size))
        data["transfers"] = asyncio.run(measure_transfers(args.transfer_rounds, args.before_src))
    data["fanout"] = asyncio.run(measure_fanout(args.fanout_episodes, args.fanout_rounds))
    if args.fanout_grpc:
        data["fanout_grpc"] = asyncio.run(measure_fanout(args.fanout_episodes, args.fanout_rounds, byte_stream=False))
    worst = max(o["median_paired_ms"] for o in data["sdk_overhead_ms"].values())
    data["targets"] = {"sdk_overhead_le_0_3ms": worst <= 0.3, "fanout_wall_le_3s": data["fanout"]["target_wall_le_3s"]}
    write_results("sdk", data, render(data))


if __name__ == "__main__":
    main()
