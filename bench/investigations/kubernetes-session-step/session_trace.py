"""Where a warm create's session step (activated -> Ready) goes, step by step, on kubesim `fast`.

Copies a tree's `src/`, `tests/` and `bench/` to a temporary directory, adds one line at each
step of the activation and the session (the gateway's and the pod supervisor's: each appends its
name and CLOCK_MONOTONIC, which every process of the machine shares, to one file), runs
`bench/kubernetes_warm.py` of that copy, and prints each step's time after the activation was
queued (p50, p90), and how often the session's write waited for the activation's. The tree's
own files are not touched. Alternate trees in one invocation to compare them under one load:

    python bench/investigations/kubernetes-session-step/session_trace.py [--warm 30] [--rounds 3] \\
        TREE [TREE...]

A step whose anchor line is not in a tree (an older protocol) is left out of that tree's rows.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRACE = "trace.log"
# (file under src/warmshell, a line that exists once, the step's name, after (True) or before it)
STEPS = [
    ("gateway/activation.py", "self._registry.activate_if_session(instance_id, registration.session_id, message)",
     "activation queued", True),
    ("gateway/supervisor_service.py", "            yield outcome", "activation sent (RegisterSupervisor)", False),
    ("gateway/supervisor_service.py", "        yield spb.GatewayMessage(activation=activation)",
     "activation sent (OpenSupervisor)", False),
    ("supervisor/main.py", "            await self._take(await self.register())", "supervisor: activation taken", True),
    ("supervisor/main.py", "            taken.set_result(True)", "supervisor: activation taken", True),
    ("supervisor/main.py", "        call = self._link.connect(requests, self._token)", "supervisor: session call made",
     True),
    ("gateway/supervisor_service.py", "        first = await anext(aiter(messages), None)", "gateway: hello read",
     True),
    ("gateway/supervisor_service.py", "        await self._refuse_if_live_elsewhere(record)",
     "gateway: session checked", True),
    ("gateway/activation.py", "            await self._record(sandbox_id, instance_id, registration, claimed_us)",
     "gateway: activation written", True),
    ("gateway/manager.py", "                status.timeline.ready_us = now_us()", "gateway: Ready (ready_us)", True),
    ("gateway/supervisor_service.py",
     "            await self._manager.on_session(claims.sandbox_id, connected=True, session_id=session.session_id)",
     "gateway: session written", True),
]  # fmt: skip


def instrument(tree: Path, into: Path, log: Path) -> None:
    """Copy `tree` into `into` with a trace line at every step whose anchor it has."""
    for part in ("src", "tests", "bench"):
        shutil.copytree(tree / part, into / part, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for relative, anchor, name, after in STEPS:
        path = into / "src" / "warmshell" / relative
        text = path.read_text()
        if text.count(anchor) != 1:
            continue
        at = text.index(anchor)
        start = text.rfind("\n", 0, at) + 1
        indent = re.match(r"\s*", text[start:])
        line = (
            f"{indent.group(0) if indent else ''}__import__('os').write(__import__('os').open({str(log)!r}, "
            f"0o2101, 0o666), ({name!r} + '|' + str(__import__('time').monotonic_ns()) + '\\n').encode())\n"
        )
        cut = text.index("\n", at) + 1 if after else start
        path.write_text(text[:cut] + line + text[cut:])


def sequences(log: Path) -> list[dict[str, int]]:
    """The steps of each activation, from its "activation queued" on (the first of each name)."""
    found: list[dict[str, int]] = []
    for line in log.read_text().splitlines():
        name, _, stamp = line.partition("|")
        if name == "activation queued":
            found.append({})
        if found and name not in found[-1]:
            found[-1][name] = int(stamp)
    return found


def report(label: str, runs: list[dict[str, int]], warmup: int) -> None:
    """Each step's time after the activation was queued, and the session write's waits."""
    runs = [r for r in runs[warmup:] if "gateway: Ready (ready_us)" in r]
    print(f"\n{label}: {len(runs)} warm creates")
    for name in dict.fromkeys(step[2] for step in STEPS):
        ms = sorted((r[name] - r["activation queued"]) / 1e6 for r in runs if name in r)
        if ms:
            print(f"  {name:40s} p50 {statistics.median(ms):6.2f}  p90 {ms[int(len(ms) * 0.9)]:6.2f} ms")
    both = [r for r in runs if "gateway: activation written" in r and "gateway: session checked" in r]
    waited = [r for r in both if r["gateway: activation written"] > r["gateway: session checked"]]
    print(f"  session checked before the activation's write was done: {len(waited)} of {len(both)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--warm", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    collected: dict[str, list[dict[str, int]]] = {str(t): [] for t in args.trees}
    with tempfile.TemporaryDirectory(prefix="ws-session-trace-") as tmp:
        for round_ in range(args.rounds):
            for index, tree in enumerate(args.trees):
                copy, log = Path(tmp) / f"tree{index}-{round_}", Path(tmp) / f"{TRACE}.{index}.{round_}"
                instrument(tree.resolve(), copy, log)
                env = os.environ | {"WARMSHELL_BENCH_TREE": str(copy), "PYTHONPATH": str(copy / "src")}
                command = [sys.executable, str(copy / "bench" / "kubernetes_warm.py"), "--warm", str(args.warm)]
                command += ["--cold", "1", "--replicas", "5", "--profiles", "fast", "--execs", "0", "--name", "trace"]
                load = os.getloadavg()[0]
                subprocess.run(command, env=env, cwd=copy, check=True, capture_output=True)
                print(f"round {round_} {tree}: load {load:.1f}", flush=True)
                collected[str(tree)] += sequences(log)[3:]  # the benchmark's 3 warm-up creates
    for tree, runs in collected.items():
        report(tree, runs, warmup=0)


if __name__ == "__main__":
    main()
