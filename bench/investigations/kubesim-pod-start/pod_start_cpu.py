"""Issue 35: where a kubesim sandbox pod's start spends its CPU, by container.

    python bench/investigations/kubesim-pod-start/pod_start_cpu.py [--pods 20] [--rounds 2]
        [--settle 0.5] [--before-src DIR] [--name pod_start_cpu]

One `kubesim serve` per round (`bench/kubesim_pods.py`'s: `default` timing, its own process), the
sandbox pod as the tree's Kubernetes driver renders it (the init container that copies the agent,
the supervisor, the workload whose pid 1 is the agent), its gateway where nothing listens. One pod
first starts both fork servers (the supervisor's import is theirs, once per node); then the fork
servers are moved into a cpuacct cgroup of their own, `--pods` pods are created, and once all are
Running and `--settle` seconds have passed:

- **all**: the cgroup's CPU per pod: every process the fork servers forked or that those started,
  exited ones included (init containers, an `ldconfig` a supervisor ran), the servers themselves;
- by kind (per pod): each fork server's own CPU (its forks' page-table copies are charged to it)
  and the live supervisors and agents, from their threads' `schedstat` (ns, not clock ticks: a
  process of a few ms shows 0 in `/proc/PID/stat`); "exited" is the rest of "all": the init
  containers and the exited threads of live processes (gRPC's).

Root only (cpuacct cgroup v1 at /sys/fs/cgroup/cpuacct, and kubesim's mount namespaces).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from harness import write_results  # noqa: E402
from kubesim_pods import all_running, pod, pod_spec  # noqa: E402
from kubesim_scale import NS, kubesim  # noqa: E402
from memory import descendants, is_kubesim_process  # noqa: E402

from kubesim.controllers import client as kc  # noqa: E402

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def on_cpu_seconds(pid: int) -> float:
    """Every live thread's time on a CPU (schedstat, ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return total / 1e9


def is_server(pid: int) -> bool:
    return b"kubelet.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()


def fork_servers(kubesim_pid: int) -> dict[int, str]:
    """kubesim's fork servers: pid -> "supervisor" (the warmshell image's) or "exec"."""
    found = [p for p in descendants(kubesim_pid) if is_server(p)]
    return {p: "supervisor" if b"supervisor" in Path(f"/proc/{p}/cmdline").read_bytes() else "exec" for p in found}


def kind_of(pid: int, servers: dict[int, str]) -> str:
    if pid in servers:
        return f"{servers[pid]} fork server"
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    return "agents" if comm == "warmshell-agent" else "supervisors" if comm == "python" else comm


def snapshot(kubesim_pid: int, servers: dict[int, str]) -> dict[str, float]:
    """CPU seconds of the live processes by kind."""
    kinds: dict[str, float] = {}
    for pid in descendants(kubesim_pid):
        if is_kubesim_process(pid) or pid == os.getpid():
            continue
        try:
            kind = kind_of(pid, servers)
            kinds[kind] = kinds.get(kind, 0.0) + on_cpu_seconds(pid)
        except OSError:
            continue
    return kinds


async def one_round(src: Path, *, pods: int, settle: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pod-start-cpu-") as tmp:
        async with kubesim(src, Path(tmp)) as served:
            api = served.admin
            spec = pod_spec(src)
            await api.create(kc.PODS, NS, pod("first", spec))  # starts both fork servers
            await all_running(api, 1)
            await asyncio.sleep(2)
            servers = fork_servers(served.process.pid)
            group = CPUACCT / f"pod-start-{os.getpid()}"
            group.mkdir()
            try:
                for pid in servers:
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        (group / "tasks").write_text(task.name)
                all0, kinds0 = int((group / "cpuacct.usage").read_text()), snapshot(served.process.pid, servers)
                for i in range(pods):
                    await api.create(kc.PODS, NS, pod(f"p-{i:03d}", spec))
                await all_running(api, pods + 1)
                await asyncio.sleep(settle)
                all1, kinds1 = int((group / "cpuacct.usage").read_text()), snapshot(served.process.pid, servers)
            finally:
                for task in (group / "tasks").read_text().split():
                    try:
                        (CPUACCT / "tasks").write_text(task)
                    except OSError:
                        continue  # gone
                group.rmdir()
    per_pod = {kind: (kinds1.get(kind, 0.0) - kinds0.get(kind, 0.0)) * 1000 / pods for kind in kinds1}
    all_ms = (all1 - all0) / 1e6 / pods
    per_pod["exited (init containers, threads)"] = all_ms - sum(per_pod.values())
    return {
        "pods": pods,
        "all_ms_per_pod": all_ms,
        "by_kind_ms_per_pod": per_pod,
        "load_average_1m": os.getloadavg()[0],
    }


def table(rounds: list[dict[str, Any]]) -> str:
    kinds = sorted({k for r in rounds for k in r["by_kind_ms_per_pod"]})
    head = "| round | tree | pods | load | **all** ms/pod | " + " | ".join(kinds) + " |\n"
    head += "|---" * (5 + len(kinds)) + "|\n"
    rows = [
        f"| {r['round']} | {r['tree']} | {r['pods']} | {r['load_average_1m']:.1f} | **{r['all_ms_per_pod']:.1f}** | "
        + " | ".join(f"{r['by_kind_ms_per_pod'].get(k, 0.0):.1f}" for k in kinds)
        + " |"
        for r in rounds
    ]
    return (
        "CPU ms per sandbox pod start: **all** = the fork servers' cgroup (every process they started, "
        "exited ones included); the rest by kind (see the script's doc).\n\n" + head + "\n".join(rows) + "\n"
    )


def alternating(before_src: str | None, rounds: int) -> Iterator[tuple[int, str, Path]]:
    """(round, tree, its src/) for each run: `before` (an older tree's src/, when given) and this
    tree in turn, `rounds` times."""
    trees = [("this", BENCH.parent / "src")]
    if before_src:
        trees.insert(0, ("before", Path(before_src).resolve()))
    for n in range(rounds):
        for label, src in trees:
            yield n, label, src


async def run(args: argparse.Namespace) -> None:
    rounds = []
    for n, label, src in alternating(args.before_src, args.rounds):
        result = await one_round(src, pods=args.pods, settle=args.settle)
        rounds.append({"round": n, "tree": label, **result})
        print(rounds[-1], flush=True)
    write_results(args.name, {"settle_seconds": args.settle, "rounds": rounds}, table(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle", type=float, default=0.5, help="seconds after all Running before measuring")
    parser.add_argument("--before-src", help="an older tree's src/ to run in alternate rounds")
    parser.add_argument("--name", default="pod_start_cpu", help="results file name under results/")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
