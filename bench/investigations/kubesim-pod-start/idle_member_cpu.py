"""Issue 35: what an idle warm member (a sandbox pod whose supervisor has registered and waits for
its activation) costs in CPU per second, by process and thread.

    python bench/investigations/kubesim-pod-start/idle_member_cpu.py [--pods 20] [--settle 5]
        [--seconds 20] [--rounds 2] [--before-src DIR] [--name idle_member_cpu]

One `kubesim serve` per round (`pod_start_cpu.py`'s), the sandbox pod as the tree's Kubernetes
driver renders it, its gateway a stand-in in this process that takes each OpenSupervisor
registration and holds the stream without answering, as a gateway holds an unclaimed warm member
(no heartbeats flow before an activation). Once `--pods` registrations have arrived and
`--settle` seconds have passed, every live process under kubesim that is not kubesim itself is
measured over `--seconds` (threads' `schedstat`, ns, and their wake-ups): ms of CPU per second per
idle member, by kind and by thread name.

Root only (kubesim's namespaces).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

BENCH = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from harness import write_results  # noqa: E402
from kubesim_pods import _RENDER, IMAGE, all_running, pod  # noqa: E402
from kubesim_scale import NS, kubesim  # noqa: E402
from memory import descendants, is_kubesim_process  # noqa: E402

from kubesim.controllers import client as kc  # noqa: E402
from warmshell.api.v1 import supervisor_pb2 as spb  # noqa: E402
from warmshell.api.v1 import supervisor_pb2_grpc  # noqa: E402


class HoldingGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Takes each registration and never answers it: every supervisor stays an idle member."""

    def __init__(self) -> None:
        self.registered = 0

    async def OpenSupervisor(
        self, request_iterator: AsyncIterator[spb.SupervisorMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[spb.GatewayMessage]:
        async for message in request_iterator:
            if message.HasField("register"):
                self.registered += 1
        return
        yield  # a stream handler that sends nothing


def pod_spec(src: Path, gateway: str) -> dict[str, Any]:
    """The sandbox pod `src`'s driver renders, pointed at `gateway`."""
    env = os.environ | {"PYTHONPATH": str(src)}
    argv = [sys.executable, "-c", _RENDER, gateway, IMAGE]
    spec: dict[str, Any] = json.loads(subprocess.run(argv, env=env, capture_output=True, check=True).stdout)
    spec.pop("serviceAccountName", None)
    return spec


def threads_of(pid: int) -> dict[str, tuple[int, int]]:
    """Each live thread of `pid`: its name and id -> (ns on a CPU, times it was scheduled)."""
    found: dict[str, tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            on_cpu, _, slices = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        found[f"{name}/{task.name}"] = (int(on_cpu), int(slices))
    return found


def is_server(pid: int) -> bool:
    return b"kubelet.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()


def kind_of(pid: int) -> str:
    """A fork server (started by kubesim), a supervisor (forked by one: the same command line,
    another parent), an agent, or the process's name."""
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if is_server(pid) and not is_server(parent):
        return "fork servers"
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    return {"warmshell-agent": "agents", "python": "supervisors"}.get(comm, comm)


def sample(kubesim_pid: int) -> dict[int, tuple[str, dict[str, tuple[int, int]]]]:
    """Every pod process: pid -> (kind, its threads)."""
    found = {}
    for pid in descendants(kubesim_pid):
        if is_kubesim_process(pid) or pid == os.getpid():
            continue
        try:
            found[pid] = (kind_of(pid), threads_of(pid))
        except OSError:
            continue
    return found


def per_member(
    before: dict[int, tuple[str, dict[str, tuple[int, int]]]],
    after: dict[int, tuple[str, dict[str, tuple[int, int]]]],
    members: int,
    seconds: float,
) -> dict[str, Any]:
    """ms of CPU and wake-ups per second per member, by kind and by (kind, thread name)."""
    kinds: dict[str, float] = {}
    threads: dict[str, list[float]] = {}
    for pid, (kind, now) in after.items():
        if pid not in before:
            continue
        for thread, (ns, slices) in now.items():
            ns0, slices0 = before[pid][1].get(thread, (ns, slices))
            ms = (ns - ns0) / 1e6 / seconds / members
            kinds[kind] = kinds.get(kind, 0.0) + ms
            name = f"{kind}: {thread.split('/')[0]}"
            cpu, wakes = threads.get(name, [0.0, 0.0])
            threads[name] = [cpu + ms, wakes + (slices - slices0) / seconds / members]
    return {
        "ms_per_second_per_member": kinds,
        "all_ms_per_second_per_member": sum(kinds.values()),
        "by_thread": {k: {"ms_per_second": v[0], "wakeups_per_second": v[1]} for k, v in sorted(threads.items())},
    }


async def one_round(src: Path, *, pods: int, settle: float, seconds: float) -> dict[str, Any]:
    gateway = HoldingGateway()
    server = grpc.aio.server()
    supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="idle-member-cpu-") as tmp:
            async with kubesim(src, Path(tmp)) as served:
                spec = pod_spec(src, f"127.0.0.1:{port}")
                for i in range(pods):
                    await served.admin.create(kc.PODS, NS, pod(f"m-{i:03d}", spec))
                await all_running(served.admin, pods)
                while gateway.registered < pods:
                    await asyncio.sleep(0.25)  # polling a counter: nothing to wait on
                await asyncio.sleep(settle)
                before = sample(served.process.pid)
                await asyncio.sleep(seconds)
                after = sample(served.process.pid)
    finally:
        await server.stop(None)
    return {"pods": pods, "load_average_1m": os.getloadavg()[0], **per_member(before, after, pods, seconds)}


def table(rounds: list[dict[str, Any]]) -> str:
    kinds = sorted({k for r in rounds for k in r["ms_per_second_per_member"]})
    head = "| round | tree | members | load | **all** ms/s per member | " + " | ".join(kinds) + " |\n"
    head += "|---" * (5 + len(kinds)) + "|\n"
    rows = [
        f"| {r['round']} | {r['tree']} | {r['pods']} | {r['load_average_1m']:.1f} | "
        f"**{r['all_ms_per_second_per_member']:.3f}** | "
        + " | ".join(f"{r['ms_per_second_per_member'].get(k, 0.0):.3f}" for k in kinds)
        + " |"
        for r in rounds
    ]
    names = sorted({t for r in rounds for t in r["by_thread"]})
    by_thread = "\n\n| thread | " + " | ".join(f"{r['tree']} {r['round']}" for r in rounds) + " |\n"
    by_thread += "|---" * (1 + len(rounds)) + "|\n"
    by_thread += "\n".join(
        f"| {t} | "
        + " | ".join(
            f"{r['by_thread'].get(t, {}).get('ms_per_second', 0.0):.3f} ms/s, "
            f"{r['by_thread'].get(t, {}).get('wakeups_per_second', 0.0):.1f} wake-ups/s"
            for r in rounds
        )
        + " |"
        for t in names
    )
    return (
        "CPU per second per idle warm member (registered, waiting for its activation), by kind; "
        "then by thread name (summed over the members' threads of that name, per member).\n\n"
        + head
        + "\n".join(rows)
        + by_thread
        + "\n"
    )


async def run(args: argparse.Namespace) -> None:
    trees = [("this", BENCH.parent / "src")]
    if args.before_src:
        trees.insert(0, ("before", Path(args.before_src).resolve()))
    rounds = []
    for n in range(args.rounds):
        for label, src in trees:
            result = await one_round(src, pods=args.pods, settle=args.settle, seconds=args.seconds)
            rounds.append({"round": n, "tree": label, **result})
            print(json.dumps(rounds[-1]), flush=True)
    write_results(args.name, {"settle_seconds": args.settle, "seconds": args.seconds, "rounds": rounds}, table(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the last registration")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before-src", help="an older tree's src/ to run in alternate rounds")
    parser.add_argument("--name", default="idle_member_cpu", help="results file name under results/")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
