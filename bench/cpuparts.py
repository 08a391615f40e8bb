"""CPU of a process split by thread (from /proc), and a Python process's busy samples split by part
of the code (from py-spy's collapsed stacks): what `replicas.py --parts cpu` reports per create."""

from __future__ import annotations

import collections
import os
from pathlib import Path

# The first frame, from the innermost out, whose file matches decides a sample's part.
PARTS: tuple[tuple[str, str], ...] = (
    ("kubernetes_asyncio/", "Kubernetes client (kubernetes_asyncio)"),
    ("aiohttp/", "HTTP (aiohttp)"),
    ("asyncio/sslproto.py", "TLS"),
    ("ssl.py", "TLS"),
    ("json/", "JSON"),
    ("pydantic", "pydantic"),
    ("grpc", "gRPC"),
    ("warmshell/drivers/kubernetes/identity.py", "driver: identity"),
    ("warmshell/drivers/kubernetes/warm/", "driver: warm path"),
    ("warmshell/drivers/kubernetes/informers.py", "driver: informers"),
    ("warmshell/drivers/kubernetes/status.py", "driver: informers"),
    ("warmshell/drivers/kubernetes/", "driver: other"),
    ("warmshell/gateway/store/", "store"),
    ("warmshell/gateway/records.py", "records"),
    ("warmshell/gateway/", "gateway: services, manager"),
    ("warmshell/", "warmshell: other"),
    ("kubesim/apiserver/", "kubesim API server"),
    ("kubesim/controllers/", "kubesim controllers"),
    ("kubesim/kubelet/", "kubesim kubelet"),
)
# The outermost frame of the main thread's samples (the processes run as `python -m ...`).
MAIN = "_run_module_as_main"
# A sample whose innermost frame is one of these is the event loop waiting, not work.
IDLE = ("select (selectors.py", "EpollSelector.select", "_worker (concurrent/futures", "wait (threading.py")


def thread_seconds(pid: int) -> dict[str, tuple[str, float]]:
    """CPU seconds (user + system) of each live thread of `pid`, by thread id, with its name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            raw = (task / "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[task.name] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def by_thread_name_ms(
    before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]], creates: int
) -> dict[str, float]:
    """CPU ms per create of each thread name between two readings (threads of one name summed;
    a thread that ended in between is not counted)."""
    split: collections.Counter[str] = collections.Counter()
    for tid, (name, seconds) in after.items():
        split[name] += seconds - before.get(tid, (name, 0.0))[1]
    return {name: ms * 1000 / max(creates, 1) for name, ms in split.most_common()}


def part_of(stack: list[str]) -> str | None:
    """The part a main-thread sample's stack (outermost frame first) belongs to; None when it is
    idle or another thread's (the main thread runs the event loop from `python -m`)."""
    if not stack or not stack[0].startswith(MAIN) or any(marker in stack[-1] for marker in IDLE):
        return None
    for frame in reversed(stack):
        for needle, part in PARTS:
            if needle in frame:
                return part
    return "event loop, other"


def main_thread_ms(
    before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]], pid: int, creates: int
) -> float:
    """CPU ms per create of the process's main thread (its thread id is the pid)."""
    tid = str(pid)
    return (after.get(tid, ("", 0.0))[1] - before.get(tid, ("", 0.0))[1]) * 1000 / max(creates, 1)


def spy_shares(path: Path) -> dict[str, float]:
    """Each part's share of the main thread's busy samples in a py-spy `--format raw` file
    (empty: no file)."""
    counts: collections.Counter[str] = collections.Counter()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        part = part_of(stack.split(";"))
        if part is not None and count.isdigit():
            counts[part] += int(count)
    total = sum(counts.values())
    return {part: n / total for part, n in counts.most_common()} if total else {}
