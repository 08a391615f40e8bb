"""The gateway's CPU per warm create with a policy alone, a policy and a secret bound to no host,
and a policy and a secret bound to its host, in turns on one gateway (the whole pool idle before
each create), by thread (`/proc/PID/task/*/comm` and `schedstat`), and over each whole cycle
(create, delete, the pool's refill). With `--profile`, the gateway runs under
`slot_profiled_gateway.py`, one cProfile of its loop per kind over the same create windows, and
the functions whose CPU differs from the policy alone's are listed per create. With `--timed`, it
runs under `timed_parts_gateway.py` instead: the pieces a secret adds, timed where they run
(their thread's CPU, no profiler), per create of each kind.

    python bench/investigations/egress-streams/secret_cpu.py --creates 60 [--profile | --timed] [--out NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import pstats
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness import GatewayProcess, gateway_process
from warm_path import wait_idle

from warmshell.api.v1 import sandbox_pb2 as pb

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.2:8080"
KINDS = ("policy", "unbound", "bound")


def specs() -> dict[str, pb.SandboxSpec]:
    """The three kinds of create: the same policy; one secret, unbound or bound to its host."""
    policy = pb.NetworkPolicy(allow=[HOST])
    bound = {"API_KEY": pb.SecretHosts(hosts=[HOST])}
    return {
        "policy": pb.SandboxSpec(network=policy),
        "unbound": pb.SandboxSpec(network=policy, secrets={"API_KEY": "sk-bench"}),
        "bound": pb.SandboxSpec(network=policy, secrets={"API_KEY": "sk-bench"}, secret_hosts=bound),
    }


def pool_files(tmp: Path) -> tuple[Path, Path]:
    """A pools directory with the pool `egress` (2 members on the host root) and a gateway config
    that lets a request widen its egress: the two files the gateway starts with."""
    pools = tmp / "pools"
    pools.mkdir()
    (pools / "egress.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 2\nimage = ""\n')
    config = tmp / "gateway.toml"
    config.write_text("[network]\nrequests_may_widen = true\n")
    return pools, config


def thread_cpu_ns(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: its name and the nanoseconds it has run."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            found[int(task.name)] = (
                (task / "comm").read_text().strip(),
                int((task / "schedstat").read_text().split()[0]),
            )
    return found


def by_thread(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> dict[str, float]:
    """Milliseconds run between two readings, by thread name (threads named alike summed; the
    main thread as "main"; numbered executor threads as one name)."""
    parts: dict[str, float] = collections.defaultdict(float)
    main = min(after)
    for tid, (name, ns) in after.items():
        label = "main" if tid == main else name.rstrip("0123456789_") or name
        parts[label] += (ns - before.get(tid, (name, 0))[1]) / 1e6
    return dict(parts)


async def cycle(gw: GatewayProcess, kind: str, name: str, spec: pb.SandboxSpec, profile: bool) -> tuple[dict, float]:
    """One create (its CPU by thread) and the whole cycle's CPU in ms."""
    pid = gw.process.pid
    await wait_idle(gw, "egress", 2)
    if profile:  # either entry: count into this kind's slot
        os.kill(pid, signal.SIGRTMIN + KINDS.index(kind))
        await asyncio.sleep(0.02)
    start = thread_cpu_ns(pid)
    await gw.create_ready(name=name, spec=spec)
    window = by_thread(start, thread_cpu_ns(pid))
    if profile:
        os.kill(pid, signal.SIGUSR2)
    await gw.delete(name)
    await wait_idle(gw, "egress", 2)
    whole = sum(by_thread(start, thread_cpu_ns(pid)).values())
    return window, whole


def timed_table(path: Path, counts: dict[str, int]) -> list[str]:
    """Per create of each kind: each timed piece's calls and microseconds of its thread's CPU."""
    slots = json.loads(path.read_text())
    lines = ["pieces timed where they run (thread CPU, no profiler), per create: calls, us"]
    for kind in KINDS:
        found = slots[KINDS.index(kind)]
        parts = "; ".join(
            f"{name} {calls / counts[kind]:.2f}x {ns / 1e3 / counts[kind]:.1f} us"
            for name, (calls, ns) in sorted(found.items())
        )
        lines.append(f"{kind}: {parts or 'none'}")
    return lines


def profile_table(prefix: Path, counts: dict[str, int]) -> list[str]:
    """Per create, each kind's main-thread total, and the functions whose own or cumulative CPU
    differs most from the policy alone's (ms per create; calls per create)."""
    stats = {kind: pstats.Stats(f"{prefix}.{KINDS.index(kind)}").stats for kind in KINDS}  # type: ignore[attr-defined]
    lines = []
    for kind in KINDS:
        total = sum(entry[2] for entry in stats[kind].values()) * 1e3 / counts[kind]
        lines.append(f"{kind}: main thread {total:.3f} ms per create (profiled)")
    for against, kind in (("policy", "unbound"), ("unbound", "bound"), ("policy", "bound")):
        base = stats[against]
        rows = []
        for func in set(base) | set(stats[kind]):
            a = base.get(func, (0, 0, 0.0, 0.0, {}))
            b = stats[kind].get(func, (0, 0, 0.0, 0.0, {}))
            d_calls = b[1] / counts[kind] - a[1] / counts[against]
            d_tt = (b[2] / counts[kind] - a[2] / counts[against]) * 1e3
            d_ct = (b[3] / counts[kind] - a[3] / counts[against]) * 1e3
            rows.append((func, d_calls, d_tt, d_ct))
        lines.append(f"\n{kind} - {against}, by own time (ms per create, calls per create):")
        for func, d_calls, d_tt, d_ct in sorted(rows, key=lambda r: -abs(r[2]))[:25]:
            lines.append(f"  own {d_tt:+.4f} cum {d_ct:+.4f} calls {d_calls:+.2f}  {pstats.func_std_string(func)}")  # type: ignore[attr-defined]
        lines.append(f"\n{kind} - {against}, by cumulative time (warmshell and cryptography only):")
        ours = [r for r in rows if "warmshell" in r[0][0] or "cryptography" in r[0][0] or "secrets" in r[0][0]]
        for func, d_calls, d_tt, d_ct in sorted(ours, key=lambda r: -abs(r[3]))[:30]:
            lines.append(f"  cum {d_ct:+.4f} own {d_tt:+.4f} calls {d_calls:+.2f}  {pstats.func_std_string(func)}")  # type: ignore[attr-defined]
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=60)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--timed", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    kinds = specs()
    windows: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    wholes: dict[str, list[float]] = {kind: [] for kind in KINDS}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        pools, config = pool_files(Path(tmp))
        prefix = Path(tmp) / "profile"
        entry = HERE / ("slot_profiled_gateway.py" if args.profile else "timed_parts_gateway.py")
        entry = entry if args.profile or args.timed else None
        env = {"WARMSHELL_CPROFILE": str(prefix), "WARMSHELL_TIMED": str(prefix)}
        async with gateway_process("--pools", str(pools), "--config", str(config), entry=entry, env=env) as gw:
            await wait_idle(gw, "egress", 2, timeout=300)
            for kind in KINDS:  # warm-up: one of each, not counted
                await cycle(gw, kind, f"warm-{kind}", kinds[kind], profile=False)
            for i in range(args.creates):
                order = KINDS[i % 3 :] + KINDS[: i % 3]
                for kind in order if i % 2 == 0 else order[::-1]:
                    window, whole = await cycle(gw, kind, f"{kind}-{i}", kinds[kind], args.profile or args.timed)
                    windows[kind].append(window)
                    wholes[kind].append(whole)
                if i % 10 == 0:
                    loads.append(os.getloadavg()[0])
            counts = {kind: len(windows[kind]) for kind in KINDS}
            if args.profile or args.timed:
                os.kill(gw.process.pid, signal.SIGUSR1)
                await asyncio.sleep(1.0)
            if args.profile:
                lines = profile_table(prefix, counts)
            elif args.timed:
                lines = timed_table(prefix, counts)
            else:
                lines = []
    loads.append(os.getloadavg()[0])
    report = summarise(windows, wholes, loads, args)
    text = "\n".join([*report, "", *lines])
    print(text)
    if args.out:
        (HERE / "results" / f"{args.out}.txt").write_text(text + "\n")
        raw = {"windows": windows, "wholes": wholes, "loads": loads, "creates": args.creates, "profile": args.profile}
        (HERE / "results" / f"{args.out}.json").write_text(json.dumps(raw) + "\n")


def summarise(windows: dict[str, list[dict]], wholes: dict[str, list[float]], loads: list[float], args) -> list[str]:
    """Medians per kind: the create's CPU in all and by thread, the whole cycle's; pair ratios."""
    command = f"secret_cpu.py --creates {args.creates}" + (" --profile" if args.profile else "")
    command += " --timed" if args.timed else ""
    lines = [f"{command}; 1-minute load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cpus"]
    totals = {kind: [sum(w.values()) for w in windows[kind]] for kind in KINDS}
    for kind in KINDS:
        names = sorted({name for w in windows[kind] for name in w})
        parts = ", ".join(
            f"{name} {statistics.median([w.get(name, 0.0) for w in windows[kind]]):.3f}" for name in names
        )
        lines.append(
            f"{kind}: create p50 {statistics.median(totals[kind]):.3f} ms (mean {statistics.mean(totals[kind]):.3f}); "
            f"by thread p50: {parts}; whole cycle p50 {statistics.median(wholes[kind]):.3f} ms"
        )
    for kind in ("unbound", "bound"):
        pairs = sorted(b / a for a, b in zip(totals["policy"], totals[kind], strict=True))
        quart = statistics.quantiles(pairs, n=4)
        p50a, p50b = statistics.median(totals["policy"]), statistics.median(totals[kind])
        whole = statistics.median(wholes[kind]) - statistics.median(wholes["policy"])
        lines.append(
            f"{kind} against policy: {p50b / p50a:.3f}x ({p50b - p50a:+.3f} ms) p50; pairs' ratios p50 "
            f"{statistics.median(pairs):.3f}, quartiles {quart[0]:.3f}-{quart[2]:.3f}; whole cycle {whole:+.3f} ms"
        )
    return lines


if __name__ == "__main__":
    asyncio.run(main())
