"""Shared pieces of the benchmarks: a gateway process, an authenticated client, statistics and
result files (JSON + a markdown table, each naming the command that produced it)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/min/max/mean of a sample, in the sample's unit (NaN for an empty sample, as
    `percentile` gives: a run whose every create failed still reports its row)."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "min": min(values, default=float("nan")),
        "max": max(values, default=float("nan")),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def create_latency_table(rows: Sequence[tuple[str, dict[str, Any]]], *, first_column: str) -> str:
    """A markdown table of create -> Ready latency, client and server views, one pair of rows per
    labelled result (each holding `client_ms`/`server_ms` summaries and its `allocations`)."""
    table = f"| {first_column} | n | p50 ms | p90 ms | p99 ms | served |\n|---|---|---|---|---|---|\n"
    for label, result in rows:
        for view in ("client_ms", "server_ms"):
            s = result[view]
            who = "client (API call -> Ready event)" if view == "client_ms" else "server timeline"
            table += (
                f"| {label}, {who} | {s['n']} | {s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f} "
                f"| {result['allocations']} |\n"
            )
    return table


@dataclass
class GatewayProcess:
    """A `warmshell gateway start` subprocess and a client for it."""

    state: Path
    process: subprocess.Popen[bytes]
    stub: sandbox_pb2_grpc.SandboxServiceStub
    channel: grpc.aio.Channel
    metadata: tuple[tuple[str, str], ...]

    async def create(self, **fields: Any) -> pb.Sandbox:
        spec = fields.pop("spec", None) or pb.SandboxSpec()
        return await self.stub.CreateSandbox(pb.CreateSandboxRequest(spec=spec, **fields), metadata=self.metadata)

    async def create_ready(self, **fields: Any) -> pb.Sandbox:
        """Create and wait until Ready as the SDK does: one CreateSandbox that waits for Ready,
        then a watch only if the reply is still Provisioning (as from a gateway without it)."""
        spec = fields.pop("spec", None) or pb.SandboxSpec()
        request = pb.CreateSandboxRequest(spec=spec, wait_ready=True, ready_timeout_ms=60_000, **fields)
        created = await self.stub.CreateSandbox(request, metadata=self.metadata)
        if created.status.phase in (pb.SANDBOX_PHASE_READY, pb.SANDBOX_PHASE_EXITED):
            return created
        return await self.wait_ready(created.name)

    async def wait_ready(self, name: str) -> pb.Sandbox:
        request = pb.WatchSandboxRequest(name=name, stop_on_ready=True, stop_on_terminal=True)
        last = None
        async for event in self.stub.WatchSandbox(request, metadata=self.metadata):
            if event.HasField("sandbox"):
                last = event.sandbox
        if last is None or last.status.phase != pb.SANDBOX_PHASE_READY:
            raise RuntimeError(f"sandbox {name} did not become Ready: {last}")
        return last

    async def delete(self, name: str) -> None:
        await self.stub.DeleteSandbox(pb.SandboxRef(name=name), metadata=self.metadata)

    async def pools(self) -> pb.ListPoolsResponse:
        return await self.stub.ListPools(pb.ListPoolsRequest(), metadata=self.metadata)


@asynccontextmanager
async def gateway_process(
    *args: str,
    cprofile: Path | None = None,
    env: dict[str, str] | None = None,
    src: Path | None = None,
    entry: Path | None = None,
) -> AsyncIterator[GatewayProcess]:
    """Start a gateway in a fresh state directory; SIGTERM it afterwards. With `cprofile`, the
    gateway runs under `profiled_gateway.py` (SIGUSR1/SIGUSR2 record its event loop to that file);
    `env` is added to its environment; with `src`, it runs the warmshell package under that
    directory (an older tree to compare); with `entry`, that script runs it (like `-m warmshell`, e.g.
    `traced_gateway.py`)."""
    with tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp:
        state = Path(tmp)
        log = open(state / "gateway.log", "wb")  # noqa: SIM115 - closed below
        if cprofile:
            entry = Path(__file__).with_name("profiled_gateway.py")
        start = [str(entry)] if entry is not None else ["-m", "warmshell"]
        env = {
            **os.environ,
            **(env or {}),
            **({"WARMSHELL_CPROFILE": str(cprofile)} if cprofile else {}),
            **({"PYTHONPATH": str(src)} if src is not None else {}),
        }
        process = subprocess.Popen(
            [
                sys.executable,
                *start,
                "gateway",
                "start",
                "--state-dir",
                str(state),
                "--http-port",
                "0",
                "--log-level",
                "WARNING",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while not (state / "gateway.json").exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((state / "gateway.log").read_text())
                await asyncio.sleep(0.05)
            token = (state / "api-token").read_text().strip()
            channel = grpc.aio.insecure_channel(f"unix://{state / 'gateway.sock'}")
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            try:
                yield GatewayProcess(state, process, stub, channel, (("authorization", f"Bearer {token}"),))
            finally:
                await channel.close(grace=None)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


def gc_pauses(gw: GatewayProcess) -> collections.Counter[str]:
    """Collections and seconds paused per generation, and pauses over 10 ms, from the gateway's
    /metrics (empty from a gateway without the metric)."""
    found: collections.Counter[str] = collections.Counter()
    try:
        address = json.loads((gw.state / "gateway.json").read_text())["http"]
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (OSError, KeyError, ValueError):
        return found
    for line in text.splitlines():
        if not line.startswith("warmshell_gc_pause_seconds"):
            continue
        name, value = line.rsplit(" ", 1)
        generation = name.split('generation="')[1].split('"')[0]
        if name.startswith("warmshell_gc_pause_seconds_count"):
            found[f"gen{generation}_collections"] += int(float(value))
        elif name.startswith("warmshell_gc_pause_seconds_sum"):
            found[f"gen{generation}_paused_ms"] += float(value) * 1000
        elif 'le="0.01"' in name:
            found["pauses_over_10ms"] -= int(float(value))
        elif 'le="+Inf"' in name:
            found["pauses_over_10ms"] += int(float(value))
    return found


def write_results(name: str, data: dict[str, Any], table: str, directory: Path | None = None) -> None:
    """results/<name>.json and <name>.md beside the script that runs (bench/results/ for a standing
    benchmark, its topic's results/ for an investigation), or in `directory`, both stating the
    command and the machine. A rerun overwrites them: each name holds one current result."""
    results = directory or Path(sys.argv[0]).resolve().parent / "results"
    results.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    meta = {
        "command": command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}",
    }
    (results / f"{name}.json").write_text(json.dumps({**meta, **data}, indent=2) + "\n")
    header = f"# {name}\n\nCommand: `{command}`  \nDate: {meta['date']}  \nMachine: {meta['machine']}\n\n"
    (results / f"{name}.md").write_text(header + table.strip() + "\n")
    print(header + table)
