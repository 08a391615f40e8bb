"""Pooled figures of `secret_cpu.py`'s unprofiled runs (`results/secret-cpu-N.json`): each run's
p50 CPU per create by kind and by thread, and the differences from a policy alone.

    python bench/investigations/egress-streams/secret_summary.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
THREADS = ("main", "ws-sqlite", "python", "event_engine", "warmshell-spawn")


def p50(windows: list[dict[str, float]], thread: str | None = None) -> float:
    """The median create's CPU (ms), of one thread or all."""
    return statistics.median(w.get(thread, 0.0) if thread else sum(w.values()) for w in windows)


def main() -> None:
    runs = sorted(RESULTS.glob("secret-cpu-[0-9]*.json"))
    rows: dict[str, list[float]] = {}
    for path in runs:
        run = json.loads(path.read_text())
        windows, loads = run["windows"], run["loads"]
        cells = [f"{path.stem} (load {min(loads):.1f}-{max(loads):.1f}):"]
        for kind in ("unbound", "bound"):
            total = p50(windows[kind]) - p50(windows["policy"])
            rows.setdefault(f"{kind} total", []).append(total)
            cells.append(f"{kind} {total:+.3f} ({p50(windows[kind]) / p50(windows['policy']):.3f}x)")
            for thread in THREADS:
                rows.setdefault(f"{kind} {thread}", []).append(
                    p50(windows[kind], thread) - p50(windows["policy"], thread)
                )
        print(" ".join(cells))
    print(f"medians over {len(runs)} runs, ms per create against a policy alone (range):")
    for name, values in rows.items():
        print(f"  {name}: {statistics.median(values):+.3f} ({min(values):+.3f} to {max(values):+.3f})")


if __name__ == "__main__":
    main()
