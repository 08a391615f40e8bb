"""Issue 35: what a warm member's pod costs in CPU once started: idle (registered, waiting for its
activation), per second, by process and thread; and claimed (activated, its session opened, then
ended by the gateway, its containers exiting), per claim.

    python bench/investigations/kubesim-pod-start/warm_member_cpu.py [--pods 20] [--claims 10]
        [--settle 5] [--seconds 20] [--rounds 2] [--before-src DIR] [--name warm_member_cpu]

One `kubesim serve` per round (`pod_start_cpu.py`'s), the sandbox pod as the tree's Kubernetes
driver renders it, its gateway a stand-in in this process: it takes each OpenSupervisor
registration and holds the stream without answering, as a gateway holds an unclaimed warm member
(no heartbeats flow before an activation). Once `--pods` registrations have arrived and `--settle`
seconds have passed:

- idle: every live process under kubesim that is not kubesim itself, over `--seconds` (threads'
  `schedstat`, ns, and their wake-ups): ms of CPU per second per idle member, by kind and thread;
- claimed: every pod thread is moved into a cpuacct cgroup of its process kind and thread name
  (so that threads and processes that exit still count), then `--claims` members are activated
  (no workload command), each answers with its session's hello, is sent `Shutdown` (the sandbox
  deleted) and ends, its agent's container with it; each cgroup's CPU until they have all exited,
  less the idle members' rate of that kind and thread over that time, per claim, and its sum.
  kubesim's own part (the kubelet reaping, the pod's end) is not in it. The idle supervisors'
  median memory is reported too (what each one's exit tears down).

Root only (kubesim's namespaces, cgroup v1 cpuacct at /sys/fs/cgroup/cpuacct).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
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
from pod_start_cpu import alternating  # noqa: E402

from kubesim.controllers import client as kc  # noqa: E402
from warmshell.api.v1 import supervisor_pb2 as spb  # noqa: E402
from warmshell.api.v1 import supervisor_pb2_grpc  # noqa: E402

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TOKEN_EXPIRES_MS = 2**62  # never refreshed within a run


class StandInGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Takes each registration and holds it until `claim` activates it; then takes the session's
    hello and ends the sandbox (`Shutdown`, not to reconnect)."""

    def __init__(self) -> None:
        self.registered = 0
        self.ended = 0
        self._waiting: list[asyncio.Event] = []
        self._names = itertools.count()

    def claim(self, count: int) -> int:
        """Activate up to `count` waiting members; how many."""
        chosen, self._waiting = self._waiting[:count], self._waiting[count:]
        for event in chosen:
            event.set()
        return len(chosen)

    async def OpenSupervisor(
        self, request_iterator: AsyncIterator[spb.SupervisorMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[spb.GatewayMessage]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or not first.HasField("register"):
            return
        claimed = asyncio.Event()
        self._waiting.append(claimed)
        self.registered += 1
        await claimed.wait()
        n = next(self._names)
        try:
            activation = spb.SupervisorActivationMessage(
                sandbox_id=f"sb-{n}", sandbox_name=f"member-{n}", token="t" * 300, token_expires_at_ms=TOKEN_EXPIRES_MS
            )
            yield spb.GatewayMessage(activation=activation)
            async for message in requests:
                if message.HasField("hello"):
                    break
            yield spb.GatewayMessage(accepted=spb.SessionAccepted(session_id=f"s-{n}", heartbeat_interval_ms=10_000))
            yield spb.GatewayMessage(shutdown=spb.Shutdown(reason="deleted"))
            async for _ in requests:
                pass
        finally:  # ended by the supervisor's half-close, or cancelled by its connection's end
            self.ended += 1


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


async def one_round(src: Path, *, pods: int, claims: int, settle: float, seconds: float) -> dict[str, Any]:
    gateway = StandInGateway()
    server = grpc.aio.server()
    supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="warm-member-cpu-") as tmp:
            async with kubesim(src, Path(tmp)) as served:
                spec = pod_spec(src, f"127.0.0.1:{port}")
                for i in range(pods):
                    await served.admin.create(kc.PODS, NS, pod(f"m-{i:03d}", spec))
                await all_running(served.admin, pods)
                await until(lambda: gateway.registered >= pods, "every member registered")
                await asyncio.sleep(settle)
                before = sample(served.process.pid)
                await asyncio.sleep(seconds)
                idle = per_member(before, sample(served.process.pid), pods, seconds)
                idle["supervisor_memory_kb"] = supervisor_memory(served.process.pid)
                claimed = await claim_cycle(served.process.pid, gateway, claims, pods, idle)
    finally:
        await server.stop(None)
    return {"pods": pods, "load_average_1m": os.getloadavg()[0], **idle, **claimed}


async def until(done: Callable[[], bool], what: str, within: float = 300.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {within:g} s: {what}")
        await asyncio.sleep(0.05)  # polling counters kept by the stand-in: nothing to wait on


async def claim_cycle(
    kubesim_pid: int, gateway: StandInGateway, claims: int, pods: int, idle: dict[str, Any]
) -> dict[str, Any]:
    """Claim `claims` members and wait until their supervisors have exited (see the module doc).
    Each pod thread goes into a cpuacct group of its kind and name (a thread's new threads join
    its group), so the claim's CPU is told apart by process kind and thread as well as in all."""
    groups: dict[str, Path] = {}
    try:
        for pid in pod_pids(kubesim_pid):
            with contextlib.suppress(OSError):  # gone meanwhile
                kind = kind_of(pid)
                for task in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError):  # a thread gone meanwhile
                        name = f"{kind}: {(task / 'comm').read_text().strip()}"
                        group = groups.get(name) or _new_group(groups, name)
                        (group / "tasks").write_text(task.name)
        supervisors = len(supervisor_pids(kubesim_pid))
        usage0, started = _usages(groups), time.monotonic()
        claimed = gateway.claim(claims)
        await until(lambda: gateway.ended >= claimed, "every claimed member's session ended")
        await until(lambda: len(supervisor_pids(kubesim_pid)) <= supervisors - claimed, "claimed supervisors exited")
        usage1, elapsed = _usages(groups), time.monotonic() - started
    finally:
        for group in groups.values():
            for task in (group / "tasks").read_text().split():
                with contextlib.suppress(OSError):  # gone
                    (CPUACCT / "tasks").write_text(task)
            group.rmdir()
    idle_rates = {name: v["ms_per_second"] for name, v in idle["by_thread"].items()}
    by_thread = {
        name: ((usage1[name] - usage0[name]) / 1e6 - idle_rates.get(name, 0.0) * (pods - claimed) * elapsed)
        / max(claimed, 1)
        for name in groups
    }
    by_kind: dict[str, float] = {}
    for name, ms in by_thread.items():
        by_kind[name.split(":")[0]] = by_kind.get(name.split(":")[0], 0.0) + ms
    return {
        "claims": claimed,
        "claim_window_seconds": elapsed,
        "ms_per_claim": sum(by_thread.values()),
        "ms_per_claim_by_kind": by_kind,
        "ms_per_claim_by_thread": dict(sorted(by_thread.items())),
    }


def _new_group(groups: dict[str, Path], name: str) -> Path:
    group = CPUACCT / f"warm-member-{os.getpid()}-{len(groups)}"
    group.mkdir()
    groups[name] = group
    return group


def _usages(groups: dict[str, Path]) -> dict[str, int]:
    return {name: int((group / "cpuacct.usage").read_text()) for name, group in groups.items()}


def supervisor_memory(kubesim_pid: int) -> dict[str, int]:
    """The idle supervisors' median resident kB (all, anonymous, file-backed) and page tables: what
    each one's exit tears down."""
    fields: dict[str, list[int]] = {"VmRSS": [], "RssAnon": [], "RssFile": [], "VmPTE": []}
    for pid in supervisor_pids(kubesim_pid):
        with contextlib.suppress(OSError):  # gone
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in fields:
                    fields[key].append(int(value.split()[0]))
    return {key: sorted(values)[len(values) // 2] for key, values in fields.items() if values}


def pod_pids(kubesim_pid: int) -> list[int]:
    return [p for p in descendants(kubesim_pid) if not is_kubesim_process(p) and p != os.getpid()]


def supervisor_pids(kubesim_pid: int) -> list[int]:
    found = []
    for pid in pod_pids(kubesim_pid):
        with contextlib.suppress(OSError):  # gone
            if kind_of(pid) == "supervisors":
                found.append(pid)
    return found


def table(rounds: list[dict[str, Any]]) -> str:
    kinds = sorted({k for r in rounds for k in r["ms_per_second_per_member"]})
    head = "| round | tree | members | load | **all** ms/s per member | " + " | ".join(kinds)
    head += " | claims | **ms per claim** |\n" + "|---" * (7 + len(kinds)) + "|\n"
    rows = [
        f"| {r['round']} | {r['tree']} | {r['pods']} | {r['load_average_1m']:.1f} | "
        f"**{r['all_ms_per_second_per_member']:.3f}** | "
        + " | ".join(f"{r['ms_per_second_per_member'].get(k, 0.0):.3f}" for k in kinds)
        + f" | {r['claims']} | **{r['ms_per_claim']:.1f}** |"
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
    claim_names = sorted({t for r in rounds for t in r["ms_per_claim_by_thread"]})
    by_claim = "\n\n| per claim, ms | " + " | ".join(f"{r['tree']} {r['round']}" for r in rounds) + " |\n"
    by_claim += "|---" * (1 + len(rounds)) + "|\n"
    by_claim += "\n".join(
        f"| {t} | " + " | ".join(f"{r['ms_per_claim_by_thread'].get(t, 0.0):.2f}" for r in rounds) + " |"
        for t in claim_names
    )
    return (
        "CPU per second per idle warm member (registered, waiting for its activation), by kind, and "
        "per claim (activation, session, shutdown, the pod's processes' exit; the idle members' rate "
        "taken off); then the idle members by thread name (per member); then the claim by process kind "
        "and thread name (each its own cpuacct group, its idle rate taken off).\n\n"
        + head
        + "\n".join(rows)
        + by_thread
        + by_claim
        + "\n"
    )


async def run(args: argparse.Namespace) -> None:
    rounds = []
    for n, label, src in alternating(args.before_src, args.rounds):
        result = await one_round(src, pods=args.pods, claims=args.claims, settle=args.settle, seconds=args.seconds)
        rounds.append({"round": n, "tree": label, **result})
        print(json.dumps(rounds[-1]), flush=True)
    write_results(args.name, {"settle_seconds": args.settle, "seconds": args.seconds, "rounds": rounds}, table(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--claims", type=int, default=10, help="members activated and ended after the idle part")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the last registration")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before-src", help="an older tree's src/ to run in alternate rounds")
    parser.add_argument("--name", default="warm_member_cpu", help="results file name under results/")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
