"""Memory of the processes a benchmark starts, and a guard for the machine it shares.

PSS (proportional set size: shared pages split between the processes sharing them) is what N
processes really cost together, so per-pod figures are the PSS of kubesim's descendants divided by
the pods running. The guard keeps a benchmark from pushing a shared machine into the OOM killer:
it sizes a run to what MemAvailable allows above a reserve left to everyone else, says loudly
when it had to size down, and stops a run whose available memory falls under its floor (half the
reserve unless given).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryGuard", "MemoryLow", "available_mib", "descendants", "is_kubesim_process", "pods_pss_mib", "pss_kib"]

PROC = Path("/proc")


class MemoryLow(RuntimeError):
    """Available memory fell under the guard's floor: the run stops before the OOM killer acts."""


def available_mib() -> float:
    """MemAvailable from /proc/meminfo, in MiB."""
    for line in (PROC / "meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children of children, ...), from /proc's children lists."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in (PROC / str(parent) / "task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def pss_kib(pid: int) -> int:
    """The process's PSS in KiB (0 when it is gone or unreadable)."""
    try:
        text = (PROC / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


@dataclass
class MemoryGuard:
    """Sizes runs to the memory available above `reserve_mib`, and watches it during them (a run
    stops under `floor_mib`, half the reserve when not given)."""

    reserve_mib: float
    floor_mib: float | None = None

    @property
    def floor(self) -> float:
        """Available MiB under which `check` stops the run."""
        return self.reserve_mib / 2 if self.floor_mib is None else self.floor_mib

    def fit(self, wanted: int, each_mib: float, what: str) -> int:
        """How many of `wanted` things of `each_mib` fit now; prints a warning when fewer do."""
        room = available_mib() - self.reserve_mib
        fits = max(0, int(room // each_mib)) if each_mib > 0 else wanted
        if fits >= wanted:
            return wanted
        print(
            f"\n*** MEMORY: {wanted} {what} at {each_mib:.0f} MiB each do not fit: {available_mib():.0f} MiB "
            f"available, {self.reserve_mib:.0f} MiB kept for others; running {fits} instead. ***\n",
            file=sys.stderr,
            flush=True,
        )
        return fits

    def check(self) -> None:
        """Raise MemoryLow when available memory is under the floor."""
        if (available := available_mib()) < self.floor:
            raise MemoryLow(f"only {available:.0f} MiB available (floor {self.floor:.0f} MiB): stopping")


def is_kubesim_process(pid: int) -> bool:
    """Whether `pid` is one of kubesim's own Python processes (`kubesim.cli`: `kubesim serve`, which
    runs its controllers and kubelet in its own process, or a tree older than that, where they ran
    in a child `kubesim.cli controllers`), not one of its pods."""
    try:
        return b"kubesim.cli" in (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def pods_pss_mib(kubesim_pid: int) -> float:
    """The summed PSS of kubesim's pods' processes (its descendants but its own processes), MiB."""
    pods = (p for p in descendants(kubesim_pid) if p != os.getpid() and not is_kubesim_process(p))
    return sum(pss_kib(p) for p in pods) / 1024
