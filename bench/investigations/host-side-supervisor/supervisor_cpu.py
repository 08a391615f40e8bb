"""Issue 14: a host-side supervisor's own CPU from its activation to Ready, per member, measured.

A local sandbox's supervisor runs on the gateway's event loop, so no /proc figure isolates it.
This runs a real gateway in this process (local driver, real bwrap'd members, one warm pool) with
a task factory that times every step of every task on the loop thread (`time.thread_time_ns`, so
only CPU spent in that step is counted, never another thread's or a wait). A supervisor's task
tree is the task `HostSupervisors.__call__` runs in plus every task created from it (the workload,
the token refresher, a gRPC call's own tasks on that transport) except `_Session._pump`: that is
the gateway's ConnectSupervisor handler, which a server would run in its own task — gateway work,
counted elsewhere. The in-process registration's handler finishes in the supervisor's own task
after the activation arrives, so that tail (a few lines) is counted as the supervisor's: the
figure is an upper bound. CPU in gRPC's C-core threads (the `grpc` transport) is not counted at
all: that transport's figure is a lower bound.

Window per member: from the moment `Supervisor.register` returns the activation to the moment the
client sees the sandbox Ready (WatchSandbox), sequential creates, one at a time; `--command` makes
each create start a workload (through the agent), which is then part of the window. `--transport grpc`
keeps the host-side supervisors on the supervisor socket (as before the in-process link), for the
comparison in the same run: by default both run, alternating in rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections.abc
import os
import sys
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness and the benchmarks reused here

import grpc
from harness import summary, write_results

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core.config import load_config
from warmshell.drivers.local.supervising import HostSupervisors
from warmshell.gateway.server import Gateway
from warmshell.supervisor.main import Supervisor

POOL_ENV = {"POOL": "supcpu"}


@dataclass
class Tree:
    """One supervisor's tasks: their CPU so far, and where it stood at the activation."""

    cpu_ns: int = 0
    at_activation: int | None = None


class Timed(collections.abc.Coroutine[Any, Any, Any]):
    """A coroutine whose every step (send/throw) adds its thread CPU to a tree."""

    def __init__(self, coro: collections.abc.Coroutine[Any, Any, Any], tree: Tree) -> None:
        self._coro = coro
        self._tree = tree

    def send(self, value: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return self._coro.send(value)
        finally:
            self._tree.cpu_ns += time.thread_time_ns() - start

    def throw(self, *args: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return self._coro.throw(*args)
        finally:
            self._tree.cpu_ns += time.thread_time_ns() - start

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()


class Accounting:
    """The task factory and the supervisor hook, and what they found."""

    def __init__(self) -> None:
        self.trees: dict[asyncio.Task[Any], Tree] = {}
        self.by_instance: dict[str, Tree] = {}

    def factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        parent = asyncio.current_task(loop)
        name = getattr(coro, "__qualname__", "")
        tree = Tree() if name == "HostSupervisors.__call__" else None
        if tree is None and parent in self.trees and name != "_Session._pump":
            tree = self.trees[parent]
        task = asyncio.Task(Timed(coro, tree) if tree is not None else coro, loop=loop, **kwargs)
        if tree is not None:
            self.trees[task] = tree
            task.add_done_callback(self.trees.pop)  # type: ignore[arg-type]
        return task

    def hook(self) -> None:
        original = Supervisor.register
        accounting = self

        async def register(supervisor: Supervisor) -> Any:
            activation = await original(supervisor)
            task = asyncio.current_task()
            tree = accounting.trees.get(task) if task is not None else None
            if tree is not None:
                tree.at_activation = tree.cpu_ns
                accounting.by_instance[supervisor.settings.instance_id] = tree
            return activation

        Supervisor.register = register  # type: ignore[method-assign]


async def wait_ready(stub: sandbox_pb2_grpc.SandboxServiceStub, metadata: Any, name: str) -> pb.Sandbox:
    async for event in stub.WatchSandbox(pb.WatchSandboxRequest(name=name), metadata=metadata):
        if event.HasField("sandbox") and event.sandbox.status.phase == pb.SANDBOX_PHASE_READY:
            return event.sandbox
    raise RuntimeError(f"watch of {name} ended before Ready")


async def idle(stub: sandbox_pb2_grpc.SandboxServiceStub, metadata: Any) -> int:
    pools = await stub.ListPools(pb.ListPoolsRequest(), metadata=metadata)
    return next((p.idle for p in pools.pools if p.name == "supcpu"), 0)


async def one_round(transport: str, count: int, command: list[str], accounting: Accounting) -> dict[str, Any]:
    """A fresh gateway with a pool of `count`, then `count` sequential warm creates."""
    with tempfile.TemporaryDirectory(prefix="ws-supcpu-") as tmp:
        root = Path(tmp)
        pools = root / "pools"
        pools.mkdir()
        env = "\n".join(f'{k} = "{v}"' for k, v in POOL_ENV.items())
        (pools / "supcpu.toml").write_text(
            f'version = 1\nworkspace = "default"\nreplicas = {count}\nimage = ""\n[environment]\n{env}\n'
        )
        settings = {
            "state_dir": str(root / "state"),
            "http_port": 0,
            "local.pools_dir": str(pools),
            "local.max_pool_replicas": count,
            "local.refill_delay_seconds": 600,  # no refills while measuring
        }
        config = load_config(None, settings)
        use = HostSupervisors.use
        if transport == "grpc":
            HostSupervisors.use = lambda self, link: None  # type: ignore[method-assign]
        gateway = Gateway(config)
        try:
            await gateway.start()
        finally:
            HostSupervisors.use = use  # type: ignore[method-assign]
        channel = grpc.aio.insecure_channel(f"unix://{config.paths.socket}")
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        metadata = (("authorization", f"Bearer {config.paths.api_token.read_text().strip()}"),)
        try:
            deadline = time.monotonic() + 120
            while await idle(stub, metadata) < count:
                if time.monotonic() > deadline:
                    raise RuntimeError("the pool never filled")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # members settle (their first heartbeats)
            cpu_ms, missing, allocations = [], 0, collections.Counter[str]()
            for i in range(count):
                await stub.CreateSandbox(
                    pb.CreateSandboxRequest(name=f"s{i}", spec=pb.SandboxSpec(environment=POOL_ENV, command=command)),
                    metadata=metadata,
                )
                ready = await wait_ready(stub, metadata, f"s{i}")
                allocations[ready.status.allocation] += 1
                tree = accounting.by_instance.get(ready.status.instance_id)
                if tree is None or tree.at_activation is None:
                    missing += 1
                    continue
                cpu_ms.append((tree.cpu_ns - tree.at_activation) / 1e6)
            return {"cpu_ms": cpu_ms, "missing": missing, "allocations": dict(allocations)}
        finally:
            await channel.close(grace=None)
            for record in await gateway.parts.records.list():
                await gateway.parts.manager.delete(record.workspace, record.name)
            await gateway.stop()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    accounting = Accounting()
    accounting.hook()
    asyncio.get_running_loop().set_task_factory(accounting.factory)
    runs: dict[str, list[float]] = {t: [] for t in args.transport}
    notes: dict[str, list[Any]] = {t: [] for t in args.transport}
    for _ in range(args.rounds):
        for transport in args.transport:
            result = await one_round(transport, args.count, args.command.split(), accounting)
            runs[transport] += result["cpu_ms"]
            notes[transport].append({"missing": result["missing"], "allocations": result["allocations"]})
    return {
        "count": args.count,
        "command": args.command,
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
        "supervisor_cpu_ms": {t: summary(v) for t, v in runs.items() if v},
        "rounds_detail": notes,
    }


def table(data: dict[str, Any]) -> str:
    lines = [
        "| transport | members | supervisor CPU activation → Ready, p50 ms | p90 | p99 | max |",
        "|---|---|---|---|---|---|",
    ]
    for transport, s in data["supervisor_cpu_ms"].items():
        lines.append(
            f"| {transport} | {s['n']} | **{s['p50']:.3f}** | {s['p90']:.3f} | {s['p99']:.3f} | {s['max']:.3f} |"
        )
    load = ", ".join(f"{x:.2f}" for x in data["load_average"])
    workload = f"`{data['command']}`" if data["command"] else "none"
    lines.append(f"\nWorkload started at activation: {workload}. Load average at the end: {load}. Target: ≤ 3 ms.")
    lines.append(f"\nPer round (members not matched, allocations): {data['rounds_detail']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=40, help="pool size and sequential warm creates per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per transport, alternating")
    parser.add_argument("--transport", nargs="+", default=["in-process", "grpc"], choices=["in-process", "grpc"])
    parser.add_argument("--command", default="", help="the workload each create starts (default: none)")
    parser.add_argument("--name", default="supervisor_cpu", help="writes results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    data = asyncio.run(measure(args))
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
