"""Issues 20 and 34: what one idle kubesim sandbox pod costs, and what its start costs. One `kubesim
serve` per round (`default` timing, its own process), `--pods` Pods as the Kubernetes driver of
the tree under test renders a sandbox's (issue 34's: an init container copying the agent, the
supervisor, and the workload container whose pid 1 is the agent; before it, the supervisor
alone), the warmshell image run by kubesim's default image rule (`python -m warmshell ...` forked
from a server that has the supervisor imported), pointed at a gateway address where nothing
listens, so every supervisor stays up retrying its registration (1 s -> 30 s backoff), then:

- fill: seconds from the first POST until every pod is Running, and the CPU of the pods' own
  processes (the supervisor's Python start and imports; with the fork server, the server's one
  import plus each fork) per pod, and kubesim's own CPU (API server, controllers, kubelet) per pod;
- idle, after the pods have settled (`--settle` seconds): PSS per pod, summed over every process
  under kubesim that is not kubesim itself (the fork server and its children included), and the
  drop of MemAvailable per pod.

`--before-src DIR` runs an older tree's `src/` (kubesim and warmshell both) in alternate rounds,
same machine, same run. `--start-slots N` sets `KUBESIM_MAX_PARALLEL_POD_STARTS` (the tree must
know it).

    python bench/kubesim_pods.py [--pods 100] [--rounds 1] [--before-src DIR] [--start-slots N] [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import write_results
from kubesim_scale import NS, TICK, kubesim
from memory import MemoryGuard, available_mib, descendants, is_kubesim_process, pss_kib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesim.controllers import client as kc  # noqa: E402

POD_MIB = 20.0  # an idle supervisor pod before the fork server, generously
IMAGE = "ghcr.io/warmshell/warmshell:bench"


# Rendered by the tree under test, so each tree's own pod shape is measured (the one-container
# pod before issue 34, the supervisor + workload pod with its init container after it).
_RENDER = """
import json, sys
from warmshell.core.config import KubernetesDriverConfig
from warmshell.drivers.kubernetes import rendering
config = KubernetesDriverConfig(gateway_address=sys.argv[1], image=sys.argv[2], termination_grace_seconds=1)
print(json.dumps(rendering.pod_spec(config, image=sys.argv[2])))
"""


def pod_spec(src: Path) -> dict[str, Any]:
    """The sandbox pod `src`'s driver renders, its gateway where nothing listens (every supervisor
    idles in its registration retry loop)."""
    env = os.environ | {"PYTHONPATH": str(src)}
    # Discard port: refused at once, every retry.
    argv = [sys.executable, "-c", _RENDER, "127.0.0.1:9", IMAGE]
    spec: dict[str, Any] = json.loads(subprocess.run(argv, env=env, capture_output=True, check=True).stdout)
    spec.pop("serviceAccountName", None)  # the namespace's default account: the token is what counts
    return spec


def pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Its own and its reaped children's: an init container's process has ended by then, reaped
    # by the fork server that started it.
    return sum(int(f) for f in fields[11:15]) / TICK


def pod_processes(kubesim_pid: int) -> list[int]:
    return [p for p in descendants(kubesim_pid) if p != os.getpid() and not is_kubesim_process(p)]


async def all_running(api: kc.KubeClient, count: int, within: float = 600.0) -> None:
    deadline = time.monotonic() + within
    while True:
        pods = (await api.request("GET", kc.PODS.path(NS, None)))["items"]
        running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        if running == count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{running}/{count} pods Running after {within:.0f} s")
        await asyncio.sleep(0.25)  # polling: the bench keeps no pod watch


async def one_round(src: Path, *, pods: int, settle: float, slots: int | None) -> dict[str, Any]:
    if slots is not None:
        os.environ["KUBESIM_MAX_PARALLEL_POD_STARTS"] = str(slots)
    with tempfile.TemporaryDirectory(prefix="kubesim-pods-") as tmp:
        async with kubesim(src, Path(tmp)) as served:
            api = served.admin
            await asyncio.sleep(2)  # let serve's start-up CPU settle before the baseline
            available0, kubesim_cpu0 = available_mib(), served.cpu_seconds()
            t0 = time.perf_counter()
            spec = pod_spec(src)
            for i in range(pods):
                await api.create(kc.PODS, NS, pod(f"sup-{i:04d}", spec))
            await all_running(api, pods)
            fill_s = time.perf_counter() - t0
            await asyncio.sleep(settle)  # the supervisors' imports finish after Running
            processes = pod_processes(served.process.pid)
            pods_cpu = sum(cpu_of(p) for p in processes)
            kubesim_cpu = served.cpu_seconds() - kubesim_cpu0
            pss_mib = sum(pss_kib(p) for p in processes) / 1024
            available_drop = available0 - available_mib()
            log = (Path(tmp) / "kubesim.log").read_text(errors="replace")
            restarts = 0
            for item in (await api.request("GET", kc.PODS.path(NS, None)))["items"]:
                for status in (item.get("status") or {}).get("containerStatuses") or []:
                    restarts += status.get("restartCount", 0)
    return {
        "pods": pods,
        "fill_seconds": fill_s,
        "processes": len(processes),
        "pss_mib_per_pod": pss_mib / pods,
        "memavailable_drop_mib_per_pod": available_drop / pods,
        "pod_cpu_ms_per_start": pods_cpu * 1000 / pods,
        "kubesim_cpu_ms_per_start": kubesim_cpu * 1000 / pods,
        "restarts": restarts,
        "kubesim_log_tail": log[-400:] if restarts else "",
        "load_average_1m": os.getloadavg()[0],
    }


def table(rounds: list[dict[str, Any]], settle: float) -> str:
    head = (
        "Idle kubesim sandbox pods as each tree's driver renders them (kubesim's default image "
        f"rule, `default` timing), measured {settle:g} s after all were Running. PSS = every process under "
        "kubesim that is not kubesim itself (fork server included), per pod. Pod CPU = those "
        "processes' CPU (and their reaped children's: init containers) per pod start; kubesim CPU = "
        "API server + controllers + kubelet per pod.\n\n"
        "| tree | pods | processes | PSS MiB/pod | MemAvailable drop MiB/pod | pod CPU ms/start "
        "| kubesim CPU ms/start | fill s | restarts | load |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r['tree']} | {r['pods']} | {r['processes']} | {r['pss_mib_per_pod']:.2f} "
        f"| {r['memavailable_drop_mib_per_pod']:.1f} | {r['pod_cpu_ms_per_start']:.1f} "
        f"| {r['kubesim_cpu_ms_per_start']:.1f} | {r['fill_seconds']:.1f} | {r['restarts']} "
        f"| {r['load_average_1m']:.1f} |"
        for r in rounds
    ]
    return head + "\n".join(rows) + "\n"


async def run(args: argparse.Namespace) -> None:
    trees = [("this", ROOT / "src")]
    if args.before_src:
        trees.insert(0, ("before", Path(args.before_src).resolve()))
    pods = MemoryGuard(args.memory_reserve_mib).fit(args.pods, POD_MIB * 2, "supervisor pods")
    rounds = []
    for n in range(args.rounds):
        for label, src in trees:
            print(f"round {n + 1}, {label} ({src}); {available_mib():.0f} MiB available", flush=True)
            result = await one_round(src, pods=pods, settle=args.settle, slots=args.start_slots)
            rounds.append({"tree": label, **result})
            print(f"  {rounds[-1]}", flush=True)
    data = {"settle_seconds": args.settle, "start_slots": args.start_slots, "rounds": rounds}
    write_results(args.name, data, table(rounds, args.settle))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after all Running before measuring")
    parser.add_argument("--before-src", help="an older tree's src/ to run in alternate rounds")
    parser.add_argument("--start-slots", type=int, help="KUBESIM_MAX_PARALLEL_POD_STARTS for every round")
    parser.add_argument("--memory-reserve-mib", type=float, default=6144.0)
    parser.add_argument("--name", default="kubesim_pods", help="results file name under bench/results/")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
