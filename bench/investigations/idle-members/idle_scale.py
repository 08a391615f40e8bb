"""Issue 14, the 1,000-idle scale part: what holding many idle members does to a gateway's event
loop and to the warm creates of another pool, before / after in one run.

    python bench/investigations/idle-members/idle_scale.py [--idle 1000] [--rounds 2] [--before-src DIR]

Each round starts a gateway per tree (`--before-src`: an older tree's src/, then this one),
runs `--creates` sequential warm creates of a small pool (`--pool`) alone, then writes a pool of
`--idle` members and creates from the small pool while it fills (for `--filling-seconds` at most:
the idle members' objects pile up in the gateway then, when the interpreter would start its full
collections), and once they are all idle:

- **loop probe**: for `--probe-seconds`, a cheap call (GetSandbox of a name that does not exist:
  NOT_FOUND from the records in memory, no driver work) every 5 ms, timed by the client. A call
  that waits tens of milliseconds waited for the event loop; the idle members' periodic liveness
  check (`local.member_check_seconds`, 2 s here so that a probe window holds several) is what
  runs there then;
- **a sandbox start's CPU** (bwrap with the driver's layout running `/bin/true`, p50 of
  `--start-rounds`), with the small pool only and with the idle members held: the host's
  process count enters a start (`pivot_root` visits every task);
- **sequential warm creates** (`--creates`) against a second pool of `--pool` members, each
  deleted before the next, with the idle members held: Ready p50/p99 of all and of the warm ones
  (a create of an empty pool goes cold), why any went cold (ListPools' misses by reason) and how
  many members were replaced after a missed probe (the gateway's log).

Every phase of creates also reports the collector's pauses the gateway exported meanwhile
(`warmshell_gc_pause_seconds`): full collections, and pauses over 10 ms.

Wall times: the machine's load enters them (it is given with each result); compare the trees
within a round.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

import grpc
from burst import load, sequential, start_breakdown
from harness import GatewayProcess, gateway_process, summary, write_results
from warm_path import idle_members, wait_idle, write_profile

from warmshell.api.v1 import sandbox_pb2 as pb

IDLE_ENV = {"POOL": "idle"}
SEQ_ENV = {"POOL": "seq"}
SLOW_MS = 20.0


def say(*what: object) -> None:
    print(time.strftime("%H:%M:%S"), *what, file=sys.stderr, flush=True)


async def probe(gw: GatewayProcess, seconds: float) -> dict[str, Any]:
    """A NOT_FOUND GetSandbox every 5 ms for `seconds`: its latency, and the calls over SLOW_MS."""
    latencies, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        sent = time.perf_counter()
        try:
            await gw.stub.GetSandbox(pb.SandboxRef(name="no-such-sandbox"), metadata=gw.metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
        latencies.append((time.perf_counter() - sent) * 1000)
        await asyncio.sleep(0.005)
    return {**summary(latencies), "slow": sum(1 for ms in latencies if ms > SLOW_MS), "load": load()}


async def one_tree(src: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ws-idle-scale-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            f"[local]\nmax_pool_replicas = {args.idle}\npool_reload_interval_seconds = 0.2\n"
            f"member_check_seconds = {args.check_seconds}\n"
        )
        async with gateway_process("--pools", str(pools), "--config", str(config), src=src) as gw:
            write_profile(pools, "seq", args.pool, SEQ_ENV)
            await wait_idle(gw, "seq", args.pool, timeout=300)
            alone = await asyncio.to_thread(sandbox_start_ms, args.start_rounds)
            small = await sequential(gw, "small", args.creates, SEQ_ENV)
            await wait_idle(gw, "seq", args.pool, timeout=300)
            write_profile(pools, "idle", args.idle, IDLE_ENV)
            # Creates while the large pool fills: its members' objects pile up in the gateway
            # then, which is when the interpreter would start full collections by itself.
            filling = asyncio.create_task(seconds_to_fill(gw, args.idle))
            window = asyncio.ensure_future(asyncio.wait((filling,), timeout=args.filling_seconds))
            during = await sequential(gw, "filling", 0, SEQ_ENV, until=window)
            # How far the fill got under the creates: a refill rule that starves it shows here.
            during["idle_when_creates_stopped"] = await idle_members(gw, "idle")
            during["fill_seconds"] = await filling
            await asyncio.sleep(2)  # the last registrations' follow-up work
            held = await asyncio.to_thread(sandbox_start_ms, args.start_rounds)
            return {
                "probe": await probe(gw, args.probe_seconds),
                "sequential_small_pool_only": small,
                "sequential_while_filling": during,
                "sequential": await sequential(gw, "held", args.creates, SEQ_ENV),
                "sandbox_start_cpu_ms": {"small pool only": alone, "idle held": held},
            }


async def seconds_to_fill(gw: GatewayProcess, size: int) -> float:
    """How long the pool "idle", just written, takes to hold `size` idle members."""
    written = time.perf_counter()
    await wait_idle(gw, "idle", size, timeout=max(900, size))
    return time.perf_counter() - written


def sandbox_start_ms(rounds: int) -> float:
    """CPU p50 of one bwrap start with the driver's layout running /bin/true (see `burst.py`)."""
    return float(start_breakdown(rounds)["now"]["cpu_ms"]["p50"]) if rounds else float("nan")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    trees: list[tuple[str, Path | None]] = [("before", args.before_src)] if args.before_src else []
    trees.append(("now", None))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in trees}
    for round_ in range(args.rounds):
        for label, src in trees:
            say(f"round {round_}: {label}, {args.idle} idle")
            try:
                runs[label].append(await one_tree(src, args))
            except RuntimeError:  # the gateway did not start in time: the last one's 1,000 members still stopping
                say("the gateway did not start; once more in 20 s")
                await asyncio.sleep(20)
                runs[label].append(await one_tree(src, args))
    return {
        "idle": args.idle, "pool": args.pool, "creates": args.creates, "check_seconds": args.check_seconds,
        "filling_seconds": args.filling_seconds, "runs": runs,
    }  # fmt: skip


def table(data: dict[str, Any]) -> str:
    text = (
        f"{data['idle']} idle members held in one pool, liveness checks every {data['check_seconds']} s; "
        f"{data.get('creates', '')} sequential creates from a second pool of {data['pool']}, first with that pool "
        "alone, then with the idle members held. One row per round and tree; the warm columns leave out "
        "the creates that went cold (their pool was empty).\n\n"
        f"| tree | round | loop probe p50 / p99 / max ms | probes over {SLOW_MS:.0f} ms | warm create -> Ready "
        "p50 / p99 / max ms, small pool alone | … idle held | all creates p99, idle held | served, idle held "
        "| why cold, missed probes | full collections (ms paused) during the held creates "
        "| sandbox start CPU ms, small pool only / idle held | load |\n" + "|---" * 12 + "|\n"
    )

    def warm(s: dict[str, Any]) -> str:
        w = s.get("warm_client_ms") or {}
        return f"{w['p50']:.2f} / {w['p99']:.2f} / {w['max']:.1f}" if w else "-"

    for label, runs in data["runs"].items():
        for index, run in enumerate(runs):
            p, s = run["probe"], run["sequential"]
            small = run.get("sequential_small_pool_only", {})
            gc = s.get("gc", {})
            text += (
                f"| {label} | {index} | {p['p50']:.2f} / {p['p99']:.2f} / {p['max']:.1f} | {p['slow']} of {p['n']} "
                f"| {warm(small)} | {warm(s)} | {s['client_ms']['p99']:.2f} | {s['allocations']} "
                f"| {s['why_cold'] or 'none'} | {gc.get('gen2_collections', 0)} ({gc.get('gen2_paused_ms', 0):.0f}) "
                f"| {run['sandbox_start_cpu_ms']['small pool only']:.2f} / "
                f"{run['sandbox_start_cpu_ms']['idle held']:.2f} | {p['load'][0]}-{s['load'][0]} |\n"
            )
    text += (
        f"\nSequential creates of the small pool while the pool of {data['idle']} fills (as many as run until it is "
        f"full, or for {data.get('filling_seconds', '')} s at most): the members' objects pile up in the "
        "gateway then, when the interpreter would start full "
        "collections by itself.\n\n| tree | round | creates | warm create -> Ready p50 / p99 / max ms "
        "| all creates p99 / max ms | served | full collections (ms paused) | collector pauses over 10 ms "
        "| idle when the creates stopped | filled after s |\n" + "|---" * 10 + "|\n"
    )
    for label, runs in data["runs"].items():
        for index, run in enumerate(runs):
            f = run.get("sequential_while_filling")
            if not f:
                continue
            gc = f.get("gc", {})
            text += (
                f"| {label} | {index} | {f['client_ms']['n']} | {warm(f)} | {f['client_ms']['p99']:.2f} / "
                f"{f['client_ms']['max']:.1f} | {f['allocations']} | {gc.get('gen2_collections', 0)} "
                f"({gc.get('gen2_paused_ms', 0):.0f}) | {gc.get('pauses_over_10ms', 0)} "
                f"| {f.get('idle_when_creates_stopped', '')} | {f.get('fill_seconds', float('nan')):.1f} |\n"
            )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=1000, help="idle members held (default 1000)")
    parser.add_argument("--pool", type=int, default=10, help="the creates' own pool (default 10)")
    parser.add_argument("--creates", type=int, default=100, help="sequential warm creates (default 100)")
    parser.add_argument("--probe-seconds", type=float, default=20.0, help="loop probe length (default 20)")
    parser.add_argument("--check-seconds", type=float, default=2.0, help="local.member_check_seconds (default 2)")
    parser.add_argument("--start-rounds", type=int, default=20, help="bwrap starts timed per reading (default 20)")
    parser.add_argument(
        "--filling-seconds",
        type=float,
        default=150.0,
        help="creates while the large pool fills stop after this long at most (default 150: past one forced full pass)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, trees alternating (default 2)")
    parser.add_argument("--before-src", type=Path, help="an older tree's src/ to run as 'before'")
    parser.add_argument("--name", default="idle_scale", help="writes results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    data = asyncio.run(measure(args))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
