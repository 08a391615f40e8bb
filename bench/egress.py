"""Issue 32 benchmark: what the egress proxy costs, on the local driver, all on loopback.

- Throughput: one client program (Python's urllib, 1 MiB reads) downloading from an upstream on
  127.0.0.2 (a threaded http.server subprocess): from the host directly, and from inside a
  sandbox through the agent's relay and the gateway's proxy; one stream of `--mib` MiB, then 16
  concurrent streams sharing the same byte count. Each pair is the same bytes, run one after the
  other (never at once), after one untimed warm-up of each; `--repeats` alternating pairs, and
  the ratio is of the medians: on a shared machine one pair swings several times either way.
- Connection setup: `--connects` TCP connections to the upstream, from the host directly, and
  through the proxy (connect to 127.0.0.1:3128 inside, CONNECT, wait for the 200); p50 added.
- Warm create -> Ready with a policy (`--allow-net`) and without, alternating against one pool.
- The gateway's CPU time per MiB proxied (its /proc stat around each proxied download): a figure
  the machine's load changes far less than the wall-clock ratios.

The sandbox the downloads run in gets as many cpus as the host has (`--cpu`): at the default of
one, its cgroup quota throttled the client and the relay, and the ratio measured the quota rather
than the proxy (the direct client runs unthrottled).

The upstream's listen backlog is 128: at http.server's default of 5, 16 connections arriving at
once overflowed it, the kernel dropped SYNs, and the clients waited the 1 s SYN retransmit, the
direct ones (arriving together) far more often than the proxied ones (spaced by the proxy's
CONNECT handling): 16 streams read 3x faster through the proxy, and connection setup had a
1 s p90 direct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    print(json.dumps({"seconds": time.perf_counter() - start}))
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


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _pair(gw: GatewayProcess, authority: str, size: int, streams: int) -> tuple[float, float, float]:
    """Seconds for the same download direct and proxied, one after the other, and the gateway's
    CPU seconds during the proxied one."""
    args = ("fetch", authority, str(size), str(streams))
    direct = _host_run(*args)["seconds"]
    before = _cpu_seconds(gw.process.pid)
    proxied = (await _sandbox_run(gw, "bench", *args))["seconds"]
    return direct, proxied, _cpu_seconds(gw.process.pid) - before


async def _throughput(gw: GatewayProcess, authority: str, mib: int, repeats: int) -> dict:
    results = {}
    total = mib << 20
    for label, streams in (("1 stream", 1), ("16 streams", 16)):
        size = total // streams
        await _pair(gw, authority, size, streams)  # warm-up: page cache, upstream threads, imports
        pairs = [await _pair(gw, authority, size, streams) for _ in range(repeats)]
        direct = statistics.median(d for d, _, _ in pairs)
        proxied = statistics.median(p for _, p, _ in pairs)
        mib_moved = size * streams / 2**20
        results[label] = {
            "mib": mib_moved,
            "direct_mib_s": mib_moved / direct,
            "proxy_mib_s": mib_moved / proxied,
            "ratio": direct / proxied,
            "ratios_each": [d / p for d, p, _ in pairs],
            "gateway_cpu_ms_per_mib": 1000 * statistics.median(c for _, _, c in pairs) / mib_moved,
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


async def _warm_creates(gw: GatewayProcess, authority: str, count: int) -> dict:
    specs = {"plain": pb.SandboxSpec(), "policy": pb.SandboxSpec(network=pb.NetworkPolicy(allow=[authority]))}
    samples: dict[str, list[float]] = {kind: [] for kind in specs}
    cold = dict.fromkeys(specs, 0)
    for i in range(count):
        for kind, spec in specs.items():
            await wait_idle(gw, "egress", 1)
            start = time.perf_counter()
            ready = await gw.create_ready(name=f"{kind}-{i}", spec=spec)
            samples[kind].append((time.perf_counter() - start) * 1000)
            cold[kind] += ready.status.allocation != "warm"
            await gw.delete(f"{kind}-{i}")
    plain, policy = summary(samples["plain"]), summary(samples["policy"])
    return {"plain_ms": plain, "policy_ms": policy, "ratio_p50": policy["p50"] / plain["p50"], "cold": cold}


async def measure(mib: int, connects: int, creates: int, pool_size: int, repeats: int) -> dict:
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
            async with gateway_process("--pools", str(pools), "--config", str(config)) as gw:
                await wait_idle(gw, "egress", pool_size, timeout=300)
                spec = pb.SandboxSpec(
                    network=pb.NetworkPolicy(allow=[authority]), resources=pb.Resources(cpu=str(os.cpu_count()))
                )
                await gw.create_ready(name="bench", spec=spec)
                data = {
                    "throughput": await _throughput(gw, authority, mib, repeats),
                    "setup": await _setup(gw, authority, connects),
                }
                await gw.delete("bench")
                data["warm_create"] = await _warm_creates(gw, authority, creates)
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
    setup = data["setup"]
    lines += [
        "",
        f"Connection setup p50: direct {setup['direct_ms']['p50']:.3f} ms, through the proxy "
        f"{setup['proxy_ms']['p50']:.3f} ms: **{setup['added_p50_ms']:+.3f} ms** added ({data['connects']} each; "
        f"p90 direct {setup['direct_ms']['p90']:.3f} ms, proxied {setup['proxy_ms']['p90']:.3f} ms).",
    ]
    warm = data["warm_create"]
    lines += [
        "",
        f"Warm create -> Ready p50: {warm['plain_ms']['p50']:.1f} ms without a policy, "
        f"{warm['policy_ms']['p50']:.1f} ms with one: **{warm['ratio_p50']:.2f}x** "
        f"({data['creates']} each, alternating; cold: {warm['cold']}).",
        "",
        "Targets (issue 32): >= 0.5x on one stream, >= 0.8x over 16, <= 2 ms setup added, <= 1.1x warm create.",
        f"Shared machine ({data['cpus']} cores, 1-minute load average {data['load_1min']:.1f} at the end): "
        "small sizes; read the ratios with that in mind.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256, help="MiB of the one-stream download (16 streams share it)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating direct/proxied pairs of each download")
    parser.add_argument("--connects", type=int, default=200)
    parser.add_argument("--creates", type=int, default=20, help="warm creates of each kind")
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args()
    data = asyncio.run(measure(args.mib, args.connects, args.creates, args.pool_size, args.repeats))
    write_results("egress", data, _table(data))


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    main()
