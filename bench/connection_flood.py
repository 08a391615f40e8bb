"""Issue 12 benchmark: a flood of connections to the gateway's `supervisor.sock` (22,500, the
figure of the report that pinned the gateway at its 20,000-descriptor limit), held open by two
helper processes, against a gateway started as `warmshell gateway start` with its defaults.

Measured: the gateway's open descriptors quiet and under the flood, ListSandboxes p50/p99 on the
public socket quiet and under the flood, an exec on a sandbox whose supervisor was connected
before the flood, and whether a new cold sandbox (whose supervisor must connect to the flooded
socket) becomes Ready while the flood holds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness import GatewayProcess, gateway_process, summary, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from warmshell.api.v1 import sandbox_pb2 as pb  # noqa: E402

HOLD = r"""
import socket, sys
path, count = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(count):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.setblocking(False)
    try:
        conn.connect(path)
    except (BlockingIOError, OSError):
        pass
    held.append(conn)
print("holding", flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
"""


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def listed_ms(gw: GatewayProcess, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def exec_echo(gw: GatewayProcess, name: str) -> tuple[int, bytes]:
    code, out = -1, b""
    async for event in gw.stub.ExecSandbox(
        pb.ExecSandboxRequest(name=name, command=["echo", "REAL"]), metadata=gw.metadata
    ):
        if event.WhichOneof("event") == "stdout":
            out += event.stdout
        elif event.WhichOneof("event") == "exit_code":
            code = event.exit_code
    return code, out


async def measure(connections: int, calls: int) -> dict[str, Any]:
    async with gateway_process() as gw:
        pid = gw.process.pid
        await gw.create(name="before")
        await gw.wait_ready("before")
        await listed_ms(gw, 50)  # warm-up
        quiet_fds = fds(pid)
        quiet = summary(await listed_ms(gw, calls))
        socket_path = str(gw.state / "supervisor.sock")
        holders = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", HOLD, socket_path, str(connections // 2),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(2)
        ]  # fmt: skip
        try:
            for holder in holders:
                assert holder.stdout is not None
                await holder.stdout.readline()
            await asyncio.sleep(2.0)  # let the gateway accept (and refuse) what it will
            flood_fds = fds(pid)
            flooded = summary(await listed_ms(gw, calls))
            exec_result = await exec_echo(gw, "before")
            await gw.create(name="during")
            try:
                await asyncio.wait_for(gw.wait_ready("during"), 15)
                during = "Ready"
            except (TimeoutError, RuntimeError) as exc:
                during = f"not Ready ({type(exc).__name__})"
        finally:
            for holder in holders:
                assert holder.stdin is not None
                holder.stdin.close()
                await holder.wait()
        await asyncio.sleep(1.0)
        after_fds = fds(pid)
        await gw.wait_ready("during")
        return {
            "connections": connections,
            "gateway_fds": {"quiet": quiet_fds, "flood": flood_fds, "after": after_fds},
            "list_ms": {"quiet": quiet, "flood": flooded},
            "exec_during_flood": [exec_result[0], exec_result[1].decode()],
            "cold_create_during_flood": during,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connections", type=int, default=22500)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    data = asyncio.run(measure(args.connections, args.calls))
    fd = data["gateway_fds"]
    ms = data["list_ms"]
    table = (
        "| | quiet | flood |\n|---|---|---|\n"
        f"| gateway open descriptors | {fd['quiet']} | {fd['flood']} (after: {fd['after']}) |\n"
        f"| ListSandboxes p50 ms | {ms['quiet']['p50']:.2f} | {ms['flood']['p50']:.2f} |\n"
        f"| ListSandboxes p99 ms | {ms['quiet']['p99']:.2f} | {ms['flood']['p99']:.2f} |\n"
        f"\n{data['connections']} connections held on supervisor.sock (default `max_connections` 4096 per "
        f"server, fd limit {os.sysconf('SC_OPEN_MAX')}). Exec on a sandbox connected before the flood: "
        f"{data['exec_during_flood']}. A cold create during the flood: {data['cold_create_during_flood']}. "
        "The machine was shared with other work.\n"
    )
    write_results("connection_flood", data, table)


if __name__ == "__main__":
    main()
