"""Issue 32 benchmark: what the egress proxy costs, on the local driver, all on loopback.

- Throughput: one client program (Python's urllib, 1 MiB reads) downloading from an upstream on
  127.0.0.2 (a threaded http.server subprocess): from the host directly, and from inside a
  sandbox through the gateway's proxy (the agent hands it its listener at the first connection,
  and the gateway accepts the sandbox's connections itself); one stream
  of `--mib` MiB, then 16 concurrent streams sharing the same byte count. Each pair is the same bytes, run one after the
  other (never at once), after one untimed warm-up of each; `--repeats` alternating pairs, and
  the ratio is of the medians: on a shared machine one pair swings several times either way.
- Connection setup: `--connects` TCP connections to the upstream, from the host directly, and
  through the proxy (connect to 127.0.0.1:3128 inside, CONNECT, wait for the 200); p50 added.
- Warm create -> Ready with a policy (`--allow-net`), with one and a secret bound to its host,
  and without, in turns against one pool.
- The CPU time per MiB of each part of the path, around each download: the client (its own
  `os.times`), the upstream and the gateway (/proc stat), the agents (their own and their reaped
  children's, less the proxied client's own report: what remains is about 20 ms a run whatever
  its size, the client's exit after it reported, so 0.16 ms "per MiB" of 128 MiB), and the
  gateway's main thread alone — the event loop that drives the splices — with how busy it was
  and how long it waited for a cpu (schedstat) over the download's wall time: figures the
  machine's load changes far less than the wall-clock ratios, and that say whether the loop or
  the load sets the proxied rate.
- The gateway's CPU per warm create (schedstat, every thread): the primary figure of the warm
  create, with the spread of its pairs' ratios, beside the wall-clock ratio (whose pairs swing
  with the host's load far more than the CPU's).
- `--before-src DIR`: whole runs (throughput, setup and, with `--creates`, the warm creates) of
  an older tree and of this one, alternating, into the investigation's `results/egress-ab.{json,md}`.

The sandbox the downloads run in gets as many cpus as the host has (`--cpu`): at the default of
one, its cgroup quota throttled the client (and the agent's relay, then), and the ratio measured
the quota rather than the proxy (the direct client runs unthrottled).

The upstream's listen backlog is 128: at http.server's default of 5, 16 connections arriving at
once overflowed it, the kernel dropped SYNs, and the clients waited the 1 s SYN retransmit, the
direct ones (arriving together) far more often than the proxied ones (spaced by the proxy's
CONNECT handling): 16 streams read 3x faster through the proxy, and connection setup had a
1 s p90 direct.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import GatewayProcess, gateway_process, summary, write_results
from warm_path import wait_idle

from warmshell.api.v1 import sandbox_pb2 as pb

UPSTREAM = """
import http.server, sys
class Bytes(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        size = int(self.path.rsplit("/", 1)[1])
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = bytes(1 << 20)
        while size > 0:
            self.wfile.write(chunk[: min(size, len(chunk))])
            size -= len(chunk)
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128
server = Server(("127.0.0.2", 0), Bytes)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# Runs on the host and in the sandbox alike: downloads, or connection setups, timed inside.
CLIENT = """
import json, os, socket, sys, threading, time, urllib.request
mode, authority, amount, streams = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def fetch():
    with urllib.request.urlopen(f"http://{authority}/bytes/{amount}") as r:
        while r.read(1 << 20):
            pass
def setup_via_proxy():
    with socket.create_connection(("127.0.0.1", 3128)) as s:
        s.sendall(f"CONNECT {authority} HTTP/1.1\\r\\nHost: {authority}\\r\\n\\r\\n".encode())
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            data += s.recv(4096)
        assert data.startswith(b"HTTP/1.1 200"), data
def setup_direct():
    host, port = authority.split(":")
    socket.create_connection((host, int(port))).close()
if mode == "fetch":
    start = time.perf_counter()
    threads = [threading.Thread(target=fetch) for _ in range(streams)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu": sum(os.times()[:2])}))
else:
    setup = setup_via_proxy if mode == "setup-proxy" else setup_direct
    times = []
    for _ in range(amount):
        start = time.perf_counter(); setup(); times.append((time.perf_counter() - start) * 1000)
    print(json.dumps({"ms": times}))
"""


def _host_run(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run([sys.executable, "-c", CLIENT, *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


async def _sandbox_run(gw: GatewayProcess, name: str, *args: str) -> dict:
    request = pb.ExecSandboxRequest(name=name, command=["python3", "-c", CLIENT, *args])
    out, err = b"", b""
    async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
        out += event.stdout
        err += event.stderr
    if not out:
        raise RuntimeError(err.decode())
    return json.loads(out)


def _cpu_seconds(stat: str, *, reaped: bool = False) -> float:
    """User + system CPU time so far of the process (or thread) whose /proc stat file is `stat`;
    with `reaped`, that of the children it has waited for too."""
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def _waiting_seconds(schedstat: str) -> float:
    """Seconds a thread has spent runnable but waiting for a cpu (its run-queue delay)."""
    try:
        return int(Path(schedstat).read_text().split()[1]) / 1e9
    except (OSError, IndexError):
        return 0.0


def _agents(root: int) -> list[int]:
    """The sandboxes' agents under the gateway `root` (each reaps its commands)."""
    parents: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm, rest = (entry / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            parents.setdefault(int(rest.split()[1]), []).append(int(entry.name))
            names[int(entry.name)] = comm.split("(", 1)[1]
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found += [pid] if names.get(pid) == "warmshell-agent" else []
        todo += parents.get(pid, [])
    return found


@dataclass
class _Costs:
    """CPU seconds of each part of a download's path (what the machine spent moving its bytes)."""

    client: float = 0.0
    upstream: float = 0.0
    agent: float = 0.0  # the agents and their reaped children less the client's report: the client's exit
    gateway: float = 0.0  # every thread of the gateway process
    loop: float = 0.0  # its main thread: the event loop, where the splices are driven
    loop_waiting: float = 0.0  # seconds that thread was runnable but waited for a cpu (schedstat)


class _Meter:
    """Reads the parts' CPU time before and after a run."""

    def __init__(self, gateway: int, upstream: int) -> None:
        self._gateway, self._upstream = gateway, upstream
        self._agents = _agents(gateway)

    def read(self) -> _Costs:
        agents = sum(_cpu_seconds(f"/proc/{pid}/stat", reaped=True) for pid in self._agents)
        return _Costs(
            upstream=_cpu_seconds(f"/proc/{self._upstream}/stat"),
            agent=agents,
            gateway=_cpu_seconds(f"/proc/{self._gateway}/stat"),
            loop=_cpu_seconds(f"/proc/{self._gateway}/task/{self._gateway}/stat"),
            loop_waiting=_waiting_seconds(f"/proc/{self._gateway}/task/{self._gateway}/schedstat"),
        )


def _spent(before: _Costs, after: _Costs, client: float, *, proxied: bool) -> _Costs:
    """What a run cost: the client's own report; the agents reaped the proxied client too."""
    return _Costs(
        client=client,
        upstream=after.upstream - before.upstream,
        agent=max(0.0, after.agent - before.agent - client) if proxied else 0.0,
        gateway=after.gateway - before.gateway if proxied else 0.0,
        loop=after.loop - before.loop if proxied else 0.0,
        loop_waiting=after.loop_waiting - before.loop_waiting if proxied else 0.0,
    )


async def _pair(meter: _Meter, gw: GatewayProcess, authority: str, size: int, streams: int) -> dict[str, Any]:
    """The same download direct and proxied, one after the other: seconds and CPU of each."""
    args = ("fetch", authority, str(size), str(streams))
    before = meter.read()
    direct = _host_run(*args)
    middle = meter.read()
    proxied = await _sandbox_run(gw, "bench", *args)
    after = meter.read()
    return {
        "direct": direct["seconds"],
        "proxied": proxied["seconds"],
        "direct_cpu": _spent(before, middle, direct["cpu"], proxied=False),
        "proxied_cpu": _spent(middle, after, proxied["cpu"], proxied=True),
        "load": os.getloadavg()[0],
    }


def _per_mib(pairs: list[dict[str, Any]], key: str, mib: float) -> dict[str, float]:
    """Median CPU milliseconds per MiB of each part, over the pairs."""
    return {
        part: 1000 * statistics.median(getattr(pair[key], part) for pair in pairs) / mib
        for part in ("client", "upstream", "agent", "gateway", "loop")
    }


async def _throughput(gw: GatewayProcess, meter: _Meter, authority: str, mib: int, repeats: int) -> dict:
    results = {}
    total = mib << 20
    for label, streams in (("1 stream", 1), ("16 streams", 16)):
        size = total // streams
        await _pair(meter, gw, authority, size, streams)  # warm-up: page cache, upstream threads, imports
        pairs = [await _pair(meter, gw, authority, size, streams) for _ in range(repeats)]
        direct = statistics.median(p["direct"] for p in pairs)
        proxied = statistics.median(p["proxied"] for p in pairs)
        mib_moved = size * streams / 2**20
        results[label] = {
            "mib": mib_moved,
            "direct_mib_s": mib_moved / direct,
            "proxy_mib_s": mib_moved / proxied,
            "ratio": direct / proxied,
            "ratios_each": [p["direct"] / p["proxied"] for p in pairs],
            "loads_each": [p["load"] for p in pairs],
            "gateway_cpu_ms_per_mib": 1000 * statistics.median(p["proxied_cpu"].gateway for p in pairs) / mib_moved,
            "direct_cpu_ms_per_mib": _per_mib(pairs, "direct_cpu", mib_moved),
            "proxied_cpu_ms_per_mib": _per_mib(pairs, "proxied_cpu", mib_moved),
            # How busy the event loop's thread was during a proxied download (1.0: saturated).
            "loop_busy_each": [p["proxied_cpu"].loop / p["proxied"] for p in pairs],
            # How long it was runnable but waiting for a cpu, as a share of the same time: the
            # machine's load, which no change to the loop's own work shortens.
            "loop_waiting_each": [p["proxied_cpu"].loop_waiting / p["proxied"] for p in pairs],
        }
    return results


async def _setup(gw: GatewayProcess, authority: str, connects: int) -> dict:
    direct = _host_run("setup-direct", authority, str(connects), "1")["ms"]
    proxied = (await _sandbox_run(gw, "bench", "setup-proxy", authority, str(connects), "1"))["ms"]
    return {
        "direct_ms": summary(direct),
        "proxy_ms": summary(proxied),
        "added_p50_ms": summary(proxied)["p50"] - summary(direct)["p50"],
    }


def _on_cpu_ms(pid: int) -> float:
    """Milliseconds the process's threads have run so far (schedstat: nanoseconds, where /proc
    stat's 10 ms ticks are as coarse as one create)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


async def _warm_creates(gw: GatewayProcess, authority: str, count: int, pool_size: int) -> dict:
    """Warm creates without a policy, with one, and with one and a secret bound to its host
    (a placeholder to swap: the CA placed in the sandbox for TLS interception too), in turns."""
    policy = pb.NetworkPolicy(allow=[authority])
    bound = {"API_KEY": pb.SecretHosts(hosts=[authority])}
    specs = {
        "plain": pb.SandboxSpec(),
        "policy": pb.SandboxSpec(network=policy),
        "secret": pb.SandboxSpec(network=policy, secrets={"API_KEY": "sk-bench"}, secret_hosts=bound),
    }
    samples: dict[str, list[float]] = {kind: [] for kind in specs}
    cpu: dict[str, list[float]] = {kind: [] for kind in specs}
    cold = dict.fromkeys(specs, 0)
    for i in range(count):
        # In turns, which goes first turning too: what one create leaves behind (its delete's
        # closes) falls on each kind alike.
        for kind in list(specs)[i % 3 :] + list(specs)[: i % 3]:
            # The whole pool idle first: a member still starting from the create before would
            # put its CPU into this one's (waiting for one idle member of two, the pairs' CPU
            # ratios spread 0.9-1.4x between quartiles, 0.6-2.1x in all); the refill this
            # create starts falls into every create alike.
            await wait_idle(gw, "egress", pool_size)
            before, start = _on_cpu_ms(gw.process.pid), time.perf_counter()
            ready = await gw.create_ready(name=f"{kind}-{i}", spec=specs[kind])
            samples[kind].append((time.perf_counter() - start) * 1000)
            cpu[kind].append(_on_cpu_ms(gw.process.pid) - before)
            cold[kind] += ready.status.allocation != "warm"
            await gw.delete(f"{kind}-{i}")
    # The gateway's CPU during each create (its every thread: the pool's refill included).
    return {
        "plain_ms": summary(samples["plain"]),
        "plain_cpu_ms": summary(cpu["plain"]),
        **_versus("", samples["policy"], cpu["policy"], samples["plain"], cpu["plain"]),
        **_versus("secret_", samples["secret"], cpu["secret"], samples["plain"], cpu["plain"]),
        "cold": cold,
    }


def _versus(prefix: str, wall: list[float], cpu: list[float], plain: list[float], plain_cpu: list[float]) -> dict:
    """One kind of create against the plain one: its figures and their ratios, p50 and by pair."""
    ratios = {
        "ratio_p50": summary(wall)["p50"] / summary(plain)["p50"],
        "pair_ratios": [p / q for p, q in zip(wall, plain, strict=True)],
        "cpu_ratio_p50": summary(cpu)["p50"] / summary(plain_cpu)["p50"],
        "cpu_pair_ratios": [p / q for p, q in zip(cpu, plain_cpu, strict=True)],
    }
    named = {"ms": summary(wall), "cpu_ms": summary(cpu)}
    kind = prefix or "policy_"
    return {f"{prefix}{key}": value for key, value in ratios.items()} | {f"{kind}{k}": v for k, v in named.items()}


async def measure(mib: int, connects: int, creates: int, pool_size: int, repeats: int, src: Path | None = None) -> dict:
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True)
    try:
        assert upstream.stdout is not None
        authority = f"127.0.0.2:{upstream.stdout.readline().strip()}"
        with tempfile.TemporaryDirectory(prefix="ws-egress-") as tmp:
            pools = Path(tmp) / "pools"
            pools.mkdir()
            profile = f'version = 1\nworkspace = "default"\nreplicas = {pool_size}\nimage = ""\n'
            (pools / "egress.toml").write_text(profile)
            config = Path(tmp) / "gateway.toml"
            config.write_text("[network]\nrequests_may_widen = true\nmax_bytes_per_second = 10000000000\n")
            async with gateway_process("--pools", str(pools), "--config", str(config), src=src) as gw:
                await wait_idle(gw, "egress", pool_size, timeout=300)
                spec = pb.SandboxSpec(
                    network=pb.NetworkPolicy(allow=[authority]), resources=pb.Resources(cpu=str(os.cpu_count()))
                )
                await gw.create_ready(name="bench", spec=spec)
                meter = _Meter(gw.process.pid, upstream.pid)
                data: dict[str, Any] = {"throughput": await _throughput(gw, meter, authority, mib, repeats)}
                if connects:
                    data["setup"] = await _setup(gw, authority, connects)
                await gw.delete("bench")
                if creates:
                    data["warm_create"] = await _warm_creates(gw, authority, creates, pool_size)
    finally:
        upstream.terminate()
        upstream.wait()
    load = os.getloadavg()[0]
    settings = {"mib": mib, "repeats": repeats, "connects": connects, "creates": creates}
    return data | settings | {"cpus": os.cpu_count(), "load_1min": load}


def _table(data: dict) -> str:
    lines = [
        f"Throughput: medians of {data['repeats']} alternating pairs after a warm-up (each pair's ratio last).",
        "",
        "| throughput | MiB | direct MiB/s | proxy MiB/s | proxy / direct | each pair | gateway CPU ms/MiB |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for label, row in data["throughput"].items():
        rates = f"{row['direct_mib_s']:.0f} | {row['proxy_mib_s']:.0f}"
        each = ", ".join(f"{ratio:.2f}" for ratio in row["ratios_each"])
        cpu = f"{row['gateway_cpu_ms_per_mib']:.2f}"
        lines.append(f"| {label} | {row['mib']:.0f} | {rates} | {row['ratio']:.2f} | {each} | {cpu} |")
    lines += _cpu_table(data)
    if "setup" in data:
        setup = data["setup"]
        lines += [
            "",
            f"Connection setup p50: direct {setup['direct_ms']['p50']:.3f} ms, through the proxy "
            f"{setup['proxy_ms']['p50']:.3f} ms: **{setup['added_p50_ms']:+.3f} ms** added ({data['connects']} each; "
            f"p90 direct {setup['direct_ms']['p90']:.3f} ms, proxied {setup['proxy_ms']['p90']:.3f} ms).",
        ]
    if "warm_create" in data:
        warm = data["warm_create"]
        lines += [
            "",
            f"Warm create with a policy, the gateway's CPU per create p50 (every thread, schedstat): "
            f"{warm['plain_cpu_ms']['p50']:.2f} ms without, {warm['policy_cpu_ms']['p50']:.2f} ms with: "
            f"**{warm['cpu_ratio_p50']:.2f}x** ({data['creates']} each, in turns; pairs' ratios "
            f"{_spread(warm['cpu_pair_ratios'])}). Wall, create -> Ready p50: {warm['plain_ms']['p50']:.1f} ms "
            f"without, {warm['policy_ms']['p50']:.1f} ms with: **{warm['ratio_p50']:.2f}x** (pairs' ratios "
            f"{_spread(warm['pair_ratios'])}; cold: {warm['cold']}).",
            "",
            f"With a policy and a secret bound to its host: CPU {warm['secret_cpu_ms']['p50']:.2f} ms, "
            f"**{warm['secret_cpu_ratio_p50']:.2f}x** (pairs' ratios {_spread(warm['secret_cpu_pair_ratios'])}); "
            f"wall {warm['secret_ms']['p50']:.1f} ms, **{warm['secret_ratio_p50']:.2f}x** (pairs' ratios "
            f"{_spread(warm['secret_pair_ratios'])}).",
        ]
    lines += [
        "",
        "Targets (issue 32): >= 0.5x on one stream, >= 0.8x over 16, <= 2 ms setup added, <= 1.1x warm create.",
        f"Shared machine ({data['cpus']} cores, 1-minute load average {data['load_1min']:.1f} at the end): "
        "small sizes; read the ratios with that in mind.",
    ]
    return "\n".join(lines) + "\n"


def _spread(values: list[float]) -> str:
    """Quartiles of a sample, as `p25-p75 (min-max)`."""
    ordered = sorted(values)
    q1, q3 = statistics.quantiles(ordered, n=4)[0::2] if len(ordered) > 1 else (ordered[0], ordered[0])
    return f"{q1:.2f}-{q3:.2f} (min {ordered[0]:.2f}, max {ordered[-1]:.2f})"


def _cpu_table(data: dict) -> list[str]:
    """Where the CPU went: each part of the path, per MiB (medians over the pairs), and how busy
    the gateway's event-loop thread was while it drove the splices."""
    lines = [
        "",
        "CPU ms per MiB moved, by part (medians; the agent column is the proxied client's exit, about 20 ms a run):",
        "",
        "| throughput | path | client | upstream | agent | gateway, all threads | its event loop | loop busy, each "
        "| loop waiting for a cpu, each |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for label, row in data["throughput"].items():
        for path in ("direct", "proxied"):
            cpu = row[f"{path}_cpu_ms_per_mib"]
            parts = " | ".join(f"{cpu[part]:.2f}" for part in ("client", "upstream", "agent", "gateway", "loop"))
            busy = ", ".join(f"{b:.2f}" for b in row["loop_busy_each"]) if path == "proxied" else ""
            waiting = ", ".join(f"{w:.2f}" for w in row["loop_waiting_each"]) if path == "proxied" else ""
            lines.append(f"| {label} | {path} | {parts} | {busy} | {waiting} |")
    loads = [load for row in data["throughput"].values() for load in row["loads_each"]]
    lines += ["", f"1-minute load average during the pairs: {min(loads):.1f} to {max(loads):.1f}."]
    return lines


async def compare(args: argparse.Namespace) -> dict:
    """`--rounds` rounds, each a whole run of this tree and one of `--before-src`'s (which goes
    first alternating): the same machine's load falls on both."""
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        for label in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
            src = args.before_src if label == "before" else None
            runs[label].append(await measure(args.mib, args.connects, args.creates, args.pool_size, args.repeats, src))
    return {"before_src": str(args.before_src), "rounds": args.rounds, "runs": runs}


def _compare_table(data: dict) -> str:
    """One row per run: ratios, setup added and the proxied path's CPU per MiB by part."""
    lines = [
        f"`before`: the tree at {data['before_src']}; `after`: this one. {data['rounds']} rounds, alternating "
        "which runs first; proxied CPU ms per MiB by part (medians of each run's pairs).",
        "",
        "| run | load | 1 stream ratio | 16 streams ratio | setup added p50 ms | 1 stream: client, agent, gateway "
        "| 16 streams: client, agent, gateway | warm create with a policy: CPU (wall) "
        "| with a policy and a bound secret: CPU (wall) |",
        "|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for label in ("before", "after"):
        for number, run in enumerate(data["runs"][label], 1):
            rows = run["throughput"]
            one, many = rows["1 stream"], rows["16 streams"]
            setup = f"{run['setup']['added_p50_ms']:+.3f}" if "setup" in run else "-"
            warm = run.get("warm_create")
            creates = f"{warm['cpu_ratio_p50']:.2f}x ({warm['ratio_p50']:.2f}x)" if warm else "-"
            secret = f"{warm['secret_cpu_ratio_p50']:.2f}x ({warm['secret_ratio_p50']:.2f}x)" if warm else "-"
            cpu = [
                ", ".join(f"{row['proxied_cpu_ms_per_mib'][part]:.2f}" for part in ("client", "agent", "gateway"))
                for row in (one, many)
            ]
            lines.append(
                f"| {label} {number} | {run['load_1min']:.1f} | {one['ratio']:.2f} | {many['ratio']:.2f} | {setup} "
                f"| {cpu[0]} | {cpu[1]} | {creates} | {secret} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256, help="MiB of the one-stream download (16 streams share it)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating direct/proxied pairs of each download")
    parser.add_argument("--connects", type=int, default=200, help="connection setups of each kind (0: none)")
    parser.add_argument("--creates", type=int, default=20, help="warm creates of each kind (0: none)")
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument(
        "--before-src",
        type=Path,
        help="compare: alternating whole runs of the warmshell package under this directory (its agent "
        "built) and of this tree; written to --out",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --before-src: runs of each")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "investigations" / "egress-streams" / "results",
        help="with --before-src: the results directory of egress-ab.{json,md}",
    )
    args = parser.parse_args()
    if args.before_src is not None:
        compared = asyncio.run(compare(args))
        write_results("egress-ab", compared, _compare_table(compared), args.out)
        return
    data = asyncio.run(measure(args.mib, args.connects, args.creates, args.pool_size, args.repeats))
    write_results("egress", data, _table(data))


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    main()
