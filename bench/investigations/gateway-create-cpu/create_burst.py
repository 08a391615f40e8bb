"""Issue 14 (gateway side): bursts of warm creates, the gateway's CPU per create split by thread,
and a create that waits for Ready in the same call against CreateSandbox + WatchSandbox.

    python bench/investigations/gateway-create-cpu/create_burst.py [--bursts 50 200] [--repeat 3] [--before-src DIR]

Each variant is a gateway of its own (a subprocess with real bwrap'd members), started in turn
and alternated `--repeat` times so that a shared machine's load falls on all of them alike:

- `before, create + watch`: the warmshell package under `--before-src` (an older tree), the
  client doing CreateSandbox then WatchSandbox until Ready (the CLI, the benchmarks until now);
- `now, create + watch`: this tree, the same client;
- `now, one call`: this tree, CreateSandbox with `wait_ready` (what the SDK does now); the client
  watches only when the reply is still Provisioning.

For each burst size N, a pool of N is filled and settled, then N creates start at once (from
connections of 25 creates each: one HTTP/2 connection carries at most 128 streams). Figures:
wall until all are Ready, when the CreateSandbox calls returned, per-create Ready p50/p99, and
the gateway process's CPU from `/proc/<pid>/task/*/schedstat` (exact, per thread) split into its
event loop, the store's worker thread (`ws-sqlite`), gRPC's C-core threads, the local driver's
spawner thread (`warmshell-spawn`) and the rest (the default executor's `to_thread` workers).
Refills run during a burst (one member at a time while creates are served): their count is
reported and the figure is also given net of them, at the gateway CPU per member start measured
on the same variant's pool fill.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

import grpc
from burst import clients
from create_cpu import CProfile
from harness import GatewayProcess, gateway_process, summary, write_results
from warm_path import descendants, wait_idle, write_profile

from warmshell.api.v1 import sandbox_pb2 as pb

CREATES_PER_CONNECTION = 25
BURST_ENV = {"POOL": "burst"}


def say(*what: object) -> None:
    print(time.strftime("%H:%M:%S"), *what, file=sys.stderr, flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def thread_ns(pid: int) -> dict[str, int]:
    """CPU ns of each of the process's threads, grouped: event loop, store worker, gRPC, other."""
    split: collections.Counter[str] = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as handle:
                comm = handle.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                ns = int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if int(tid) == pid:
            group = "event loop"
        elif comm == "ws-sqlite":
            group = "store worker"
        elif comm.startswith(("grpc", "event_engine", "default-executo", "resolver", "timer")):
            group = "gRPC C-core"
        elif comm.startswith("warmshell-spawn"):
            group = "spawner"
        else:
            group = "other threads"
        split[group] += ns
    return dict(split)


def cpu_ns(pid: int) -> int:
    try:
        return sum(thread_ns(pid).values())
    except OSError:
        return 0


async def one_create(gw: GatewayProcess, name: str, one_call: bool, start: float) -> dict[str, Any]:
    """A create as a client does it: one call that waits for Ready (the SDK; a reply still
    Provisioning is watched), or CreateSandbox then WatchSandbox until Ready (the CLI)."""
    spec = pb.SandboxSpec(environment=BURST_ENV)
    if one_call:
        ready = await gw.create_ready(name=name, spec=spec)
        returned = (time.perf_counter() - start) * 1000
    else:
        await gw.create(name=name, spec=spec)
        returned = (time.perf_counter() - start) * 1000
        ready = await gw.wait_ready(name)
    return {
        "returned_ms": returned,
        "ready_ms": (time.perf_counter() - start) * 1000,
        "allocation": ready.status.allocation,
    }


async def fill(gw: GatewayProcess, pools: Path, size: int) -> float:
    """A pool of `size` filled and settled; the gateway's CPU per member start (ms)."""
    before = cpu_ns(gw.process.pid)
    write_profile(pools, "burst", size, BURST_ENV)
    await wait_idle(gw, "burst", size, timeout=max(120, size))
    per_member = (cpu_ns(gw.process.pid) - before) / 1e6 / size
    previous = cpu_ns(gw.process.pid)
    for _ in range(20):  # until the last registrations' follow-up work is done
        await asyncio.sleep(0.25)
        now = cpu_ns(gw.process.pid)
        if now - previous <= 5_000_000:
            break
        previous = now
    return per_member


async def burst(
    gw: GatewayProcess, pools: Path, size: int, one_call: bool, run: str, spy: str | None, profile: Path | None
) -> dict[str, Any]:
    member_start_ms = await fill(gw, pools, size)
    members = descendants(gw.process.pid)
    names = [f"{run}-{i}" for i in range(size)]
    async with clients(gw, (size + CREATES_PER_CONNECTION - 1) // CREATES_PER_CONNECTION) as callers:
        await asyncio.gather(*(c.pools() for c in callers))  # connected before the clock starts
        recorder = None
        if spy:  # every thread, idle ones too (a thread waiting for the GIL shows as running anyway)
            recorder = subprocess.Popen(
                ["py-spy", "record", "--pid", str(gw.process.pid), "--rate", "500", "--format", "raw",
                 "--threads", "--nonblocking", "--output", f"{spy}.{size}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(1.5)  # attached
        profiling = CProfile(gw.process.pid, profile) if profile is not None else contextlib.nullcontext()
        await profiling.__aenter__()
        load_before, threads_before, client_before = load(), thread_ns(gw.process.pid), time.process_time()
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one_create(callers[i // CREATES_PER_CONNECTION], n, one_call, start) for i, n in enumerate(names)),
            return_exceptions=True,
        )
        wall_ms = (time.perf_counter() - start) * 1000
        threads_after, client_ms = thread_ns(gw.process.pid), (time.process_time() - client_before) * 1000
        await profiling.__aexit__(None, None, None)
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            await asyncio.to_thread(recorder.wait, 60)
    refills = len(descendants(gw.process.pid) - members) // 2  # a member is bwrap + its agent
    ok = [r for r in results if not isinstance(r, BaseException)]
    with contextlib.suppress(grpc.aio.AioRpcError):
        for chunk in range(0, size, 20):
            await asyncio.gather(*(gw.delete(n) for n in names[chunk : chunk + 20]), return_exceptions=True)
    write_profile(pools, "burst", 1, BURST_ENV)
    by_thread = {k: (threads_after[k] - threads_before.get(k, 0)) / 1e6 / size for k in threads_after}
    total = sum(by_thread.values())
    return {
        "size": size,
        "errors": [repr(r) for r in results if isinstance(r, BaseException)],
        "warm": sum(1 for r in ok if r["allocation"] == "warm"),
        "client_cpu_ms_per_create": client_ms / size,
        "wall_ms": wall_ms,
        "returned_ms": summary([r["returned_ms"] for r in ok]) if ok else {},
        "ready_ms": summary([r["ready_ms"] for r in ok]) if ok else {},
        "gateway_cpu_ms_per_create": total,
        "gateway_cpu_ms_per_create_by_thread": by_thread,
        "refills_during_burst": refills,
        "gateway_cpu_ms_per_member_start": member_start_ms,
        "gateway_cpu_ms_per_create_net_of_refills": total - refills * member_start_ms / size,
        "load_before": load_before,
        "load_after": load(),
    }


async def variant(
    label: str, src: Path | None, one_call: bool, sizes: list[int], run: int, spy: str | None, profile: Path | None
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ws-create-burst-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        config = Path(tmp) / "gateway.toml"
        config.write_text(f"[local]\nmax_pool_replicas = {max(sizes)}\npool_reload_interval_seconds = 0.2\n")
        stats = Path(tmp) / "gateway.pstats" if profile is not None else None
        async with gateway_process("--pools", str(pools), "--config", str(config), src=src, cprofile=stats) as gw:
            results = []
            for size in sizes:
                say(f"{label}: burst of {size} (run {run})")
                results.append(await burst(gw, pools, size, one_call, f"b{run}-{size}", spy, stats))
            if stats is not None and profile is not None:
                shutil.copy(stats, profile)
            return results


def variants(args: argparse.Namespace) -> list[tuple[str, Path | None, bool]]:
    found: list[tuple[str, Path | None, bool]] = []
    if args.before_src:
        found.append(
            (
                "before, one call" if args.one_call_only else "before, create + watch",
                args.before_src,
                args.one_call_only,
            )
        )
    if not args.one_call_only:
        found.append(("now, create + watch", None, False))
    return [*found, ("now, one call", None, True)]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[list[dict[str, Any]]]] = collections.defaultdict(list)
    for run in range(args.repeat):
        for label, src, one_call in variants(args):
            spy = f"{args.py_spy}.{label.replace(', ', '-').replace(' ', '_')}.{run}" if args.py_spy else None
            profile = None
            if args.cprofile:  # the event loop during the bursts, one file per variant and run
                profile = Path(f"{args.cprofile}.{label.replace(', ', '-').replace(' ', '_')}.{run}")
            runs[label].append(await variant(label, src, one_call, args.bursts, run, spy, profile))
    return {"bursts": args.bursts, "repeat": args.repeat, "runs": dict(runs)}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def table(data: dict[str, Any]) -> str:
    text = (
        "Medians over the runs (each run's figure in brackets). Gateway CPU per create from "
        "/proc/<pid>/task/*/schedstat, all its threads.\n\n"
    )
    groups = ["event loop", "store worker", "gRPC C-core", "spawner", "other threads"]
    text += (
        "| variant | burst | all Ready ms | calls returned p50 / max ms | Ready p50 / p99 ms | warm "
        "| client CPU ms/create | gateway CPU ms/create | net of refills | "
        + " / ".join(groups)
        + " | refills | load |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for index, size in enumerate(data["bursts"]):
        for label, runs in data["runs"].items():
            rows = [r[index] for r in runs]

            def cell(key: str, rows: list[dict[str, Any]] = rows) -> str:
                values = [r[key] for r in rows]
                return f"**{_median(values):.2f}** ({', '.join(f'{v:.2f}' for v in values)})"

            wall = [r["wall_ms"] for r in rows]
            split = " / ".join(
                f"{_median([r['gateway_cpu_ms_per_create_by_thread'].get(g, 0.0) for r in rows]):.2f}" for g in groups
            )
            text += (
                f"| {label} | {size} | **{_median(wall):.0f}** ({', '.join(f'{w:.0f}' for w in wall)}) "
                f"| {_median([r['returned_ms']['p50'] for r in rows]):.0f} / "
                f"{_median([r['returned_ms']['max'] for r in rows]):.0f} "
                f"| {_median([r['ready_ms']['p50'] for r in rows]):.0f} / "
                f"{_median([r['ready_ms']['p99'] for r in rows]):.0f} "
                f"| {sum(r['warm'] for r in rows)}/{size * len(rows)} "
                f"| {_median([r['client_cpu_ms_per_create'] for r in rows]):.2f} "
                f"| {cell('gateway_cpu_ms_per_create')} | {cell('gateway_cpu_ms_per_create_net_of_refills')} "
                f"| {split} | {sum(r['refills_during_burst'] for r in rows)} "
                f"| {rows[0]['load_before'][0]}-{rows[-1]['load_after'][0]} |\n"
            )
    errors = [e for runs in data["runs"].values() for run in runs for r in run for e in r["errors"]]
    text += f"\nErrors: {len(errors)}{' (' + errors[0] + ')' if errors else ''}.\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bursts", type=int, nargs="+", default=[50, 200], help="burst sizes")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every variant, alternating")
    parser.add_argument("--before-src", type=Path, help="an older tree's src/ to run as the 'before' gateway")
    parser.add_argument("--py-spy", default="", help="record each burst with py-spy to FILE.<variant>.<run>.<size>")
    parser.add_argument(
        "--one-call-only", action="store_true", help="every variant creates in one call (no create + watch runs)"
    )
    parser.add_argument(
        "--cprofile", default="", help="record the bursts' event loop with cProfile to FILE.<variant>.<run>"
    )
    parser.add_argument("--name", default="create_burst", help="writes results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    data = asyncio.run(measure(args))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
