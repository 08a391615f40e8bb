"""Issue 2 benchmark: cold create -> Ready and exec round trip on the local driver, next to the
cost of spawning the same bwrap'd Python process by hand, measured in the same run.

The baseline runs bubblewrap with exactly the sandbox layout the local driver builds, starting
the same interpreter and importing the supervisor (everything a supervisor does before it first
talks to the gateway), then exiting. Cold create -> Ready adds what warmshell itself does: the
API call, persistence, spawn, registration, activation and the supervisor session.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

from harness import gateway_process, summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.runtime import sandboxing


def baseline_argv(state: Path) -> list[str]:
    """The driver's bwrap layout (namespaces, allow-listed root) running `/bin/true` instead of
    the agent: what starting any sandbox costs. (Before the supervisor moved out of the sandbox
    this baseline was bwrap + Python + the supervisor's imports, the floor of that design.)"""
    workspace = state / "baseline-ws"
    workspace.mkdir(exist_ok=True)
    plan = sandboxing.host_root_plan(sandboxing.list_root(Path("/")), os.listdir("/etc"))
    layout = sandboxing.SandboxLayout(
        bwrap="bwrap",
        plan=plan,
        workspace_dir=workspace,
        agent=Path("/bin/true"),
        control_fd=0,
        seccomp_fd=0,
        hostname="baseline",
    )
    argv = sandboxing.bwrap_argv(layout)
    seccomp_at = argv.index("--seccomp")
    del argv[seccomp_at : seccomp_at + 2]
    return [*argv[: argv.index("--")], "--", "/bin/true"]


def measure_baseline(count: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="ws-baseline-") as tmp:
        argv = baseline_argv(Path(tmp))
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            subprocess.run(argv, check=True)
            samples.append((time.perf_counter() - start) * 1000)
        return samples


async def measure(creates: int, execs: int) -> dict[str, object]:
    baseline = measure_baseline(creates)
    async with gateway_process() as gw:
        client_ms, server_ms = [], []
        for i in range(creates):
            name = f"cold-{i}"
            start = time.perf_counter()
            await gw.create(name=name)
            ready = await gw.wait_ready(name)
            client_ms.append((time.perf_counter() - start) * 1000)
            timeline = ready.status.timeline
            server_ms.append((timeline.ready_us - timeline.requested_us) / 1000)
            await gw.delete(name)
        await gw.create(name="exec-target")
        await gw.wait_ready("exec-target")
        exec_ms = []
        request = pb.ExecSandboxRequest(name="exec-target", command=["true"])
        for _ in range(20):  # warm-up: connection, first fork
            async for _event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
                pass
        for _ in range(execs):
            start = time.perf_counter()
            code = None
            async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata):
                if event.WhichOneof("event") == "exit_code":
                    code = event.exit_code
            exec_ms.append((time.perf_counter() - start) * 1000)
            assert code == 0
        await gw.delete("exec-target")
    return {
        "baseline_bwrap_spawn_ms": summary(baseline),
        "cold_create_ready_client_ms": summary(client_ms),
        "cold_create_ready_server_timeline_ms": summary(server_ms),
        "exec_true_round_trip_ms": summary(exec_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=50)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--name", default="cold_path", help="results file name under bench/results/")
    args = parser.parse_args()
    data = asyncio.run(measure(args.creates, args.execs))
    base = data["baseline_bwrap_spawn_ms"]["p50"]  # type: ignore[index]
    cold = data["cold_create_ready_client_ms"]
    execs = data["exec_true_round_trip_ms"]
    ratio = cold["p50"] / base  # type: ignore[index]
    data["cold_p50_over_baseline_p50"] = ratio
    data["targets"] = {"cold_ratio_le_3": ratio <= 3, "exec_p50_le_5ms": execs["p50"] <= 5}  # type: ignore[index]
    rows = [
        ("bwrap with the sandbox layout running /bin/true, by hand (baseline)", data["baseline_bwrap_spawn_ms"]),
        ("cold create -> Ready (client: API call to Ready event)", cold),
        ("cold create -> Ready (server timeline: requested -> ready)", data["cold_create_ready_server_timeline_ms"]),
        ("exec `true` round trip (API call -> exit code)", execs),
    ]
    table = "| measurement | n | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|---|\n"
    for label, s in rows:
        table += f"| {label} | {s['n']} | {s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f} |\n"  # type: ignore[index]
    table += (
        f"\nCold create -> Ready p50 is **{ratio:.2f}x** the baseline spawn (target <= 3x); "
        f"exec p50 **{execs['p50']:.2f} ms** (target <= 5 ms).\n"  # type: ignore[index]
    )
    write_results(args.name, data, table)


if __name__ == "__main__":
    main()
