"""kubesim's busy samples in a py-spy raw profile (`replicas.py --parts cpu` records one per round)
split by part, with the socket sends left out: py-spy samples wall time, and a thread that wakes the
reader of a loopback socket is often preempted inside `send()` on a loaded host; that waiting is
not CPU (see the README).

    python bench/investigations/kubesim-api-cpu/split_profile.py PROFILE [CPU_MS_PER_CREATE]
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import cpuparts

SENDS = ("_SelectorSocketTransport.write (asyncio/selector_events.py", "_UnixWritePipeTransport.write (asyncio/")
POD_START_STOP = ("_run_container", "_main (kubesim/kubelet/pods.py", "forkserver", "Kubelet._stop")


def part(frames: list[str]) -> str:
    """The part one sample (outermost frame first) belongs to."""
    stack = ";".join(frames)
    leaf = frames[-1]
    json_leaf = "jsonwire" in leaf or "json/" in leaf
    pod = "kubesim/kubelet/" in stack and any(marker in stack for marker in POD_START_STOP)
    if "Handler.handle (kubesim/apiserver/handlers.py" in stack:
        inner = "JSON" if json_leaf else "REST path"
        if "InProcessClient._exchange" in stack:
            return "kubelet: a pod's start and stop" if pod else f"{inner}: kubesim's own requests"
        return f"{inner}: the gateway's requests"
    if pod:
        return "kubelet: a pod's start and stop"
    if "_pump (kubesim/apiserver/watch.py" in stack:
        return "watch streams to the gateway (aiohttp, TLS)"
    if "aiohttp/" in stack or "sslproto" in stack or "ssl.py" in stack:
        return "HTTP and TLS (aiohttp), reading and answering"
    if "kubesim/kubelet/" in stack:
        return "kubelet: status, other"
    if "kubesim/controllers/" in stack:
        return "JSON: controllers" if json_leaf else "controllers (informers, reconciles)"
    if "kubesim/apiserver/" in stack:
        return "API server: other (GC controller, watch)"
    return "event loop, other"


def main() -> None:
    path = Path(sys.argv[1])
    ms = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    counts: collections.Counter[str] = collections.Counter()
    sends = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if cpuparts.part_of(frames) is None:
            continue
        if frames[-1].startswith(SENDS):
            sends += int(count)
            continue
        counts[part(frames)] += int(count)
    total = sum(counts.values())
    print(f"busy samples {total} (socket sends left out: {sends})")
    for name, n in counts.most_common():
        print(f"| {name} | {n * 100 / total:.0f}% |" + (f" {n / total * ms:.1f} |" if ms else ""))


if __name__ == "__main__":
    main()
