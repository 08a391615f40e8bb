"""Issue 17: the shape of each driver's `driver.py`, and how often one warm create enters it.

Static, per driver: lines of `driver.py`, its methods, its longest functions (ast: from the `def`
line to the last line of the body, decorators excluded).

Dynamic, per driver: a `sys.setprofile` hook on the event loop's thread, installed for one warm
create -> Ready through a real gateway in this process (local: bubblewrap'd pool members;
Kubernetes: kubesim in a process of its own, pods running the real supervisor). The create is
CreateSandbox, then WatchSandbox until Ready, against a full pool, after one warm-up create (so
first-use imports and caches are not counted). An *entry* is a Python `call` event of a frame in
`driver.py` whose caller is not `driver.py`; a coroutine of `driver.py` resumed by the event
loop is a call too, so the counts are upper bounds. Entries are grouped by caller: the gateway,
the driver's own components (its package), tasks resumed by the event loop, and anything else.
The gateway's periodic reconciler is set an hour apart, so its pass (no part of a create) does
not land in the window by chance.
"Modules touched" counts the distinct `warmshell` modules with any call during the window.

With `--baseline REV` the same measurement also runs on an older revision of this repository (a
temporary `git archive` of it, its agent built, in a subprocess importing its code) and the table
shows both. Results go to bench/results/driver_entries.{json,md}. A run takes about a minute.

    python bench/driver_entries.py [--baseline REV]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DRIVERS = ("local", "kubernetes")
POOL = "entries"
REPLICAS = 3
WARM_ENV = {"FOO": "bar"}
# The pool's shape spells its cpu as "0.5" (cores), the request as "500m": one amount.
SPEC_RESOURCES = {"cpu": "500m", "memory": "256Mi"}
# The periodic reconciler is no part of a create: an hour apart, its pass never lands in the window.
QUIET = {"reconcile_interval_seconds": 3600.0}


# -- static shape ----------------------------------------------------------------------------


def shape_of_file(path: Path) -> dict[str, Any]:
    """Lines, methods of the driver class, and the five longest functions of a driver.py."""
    text = path.read_text()
    tree = ast.parse(text)
    functions = [
        (node.end_lineno - node.lineno + 1, node.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    ]
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Driver")]
    methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for cls in classes for item in cls.body)
    longest = sorted(functions, reverse=True)[:5]
    return {
        "lines": len(text.splitlines()),
        "methods": methods,
        "longest": [{"name": name, "lines": lines} for lines, name in longest],
        "over_30": [name for lines, name in functions if lines > 30],
    }


# -- entries per create ----------------------------------------------------------------------


class EntryCounter:
    """The profile hook: entries into one file, by caller group, and the warmshell modules seen."""

    def __init__(self, driver_file: str, package_dir: str, warmshell_dir: str) -> None:
        self.driver_file = driver_file
        self.package_dir = package_dir
        self.warmshell_dir = warmshell_dir
        self.entries: collections.Counter[str] = collections.Counter()
        self.by_callee: collections.Counter[str] = collections.Counter()
        self.modules: set[str] = set()
        self.quantity_parses: collections.Counter[str] = collections.Counter()

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if filename.startswith(self.warmshell_dir):
            self.modules.add(filename)
            if frame.f_code.co_name == "_parse" and filename.endswith(os.path.join("core", "quantities.py")):
                self.quantity_parses[_short(_caller_of(frame.f_back))] += 1
        if filename != self.driver_file:
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if caller == self.driver_file:
            return
        group = self._group(caller)
        self.entries[group] += 1
        self.by_callee[f"{frame.f_code.co_name} <- {group}: {_short(caller)}"] += 1

    def _group(self, caller: str) -> str:
        if caller.startswith(os.path.join(self.warmshell_dir, "gateway")):
            return "gateway"
        if caller.startswith(self.package_dir):
            return "own components"
        if "asyncio" in caller or not caller:
            return "tasks on the loop"
        return "other"


def _caller_of(frame: types.FrameType | None) -> str:
    """The first file up the stack outside quantities.py (who asked for the parse)."""
    while frame is not None and frame.f_code.co_filename.endswith("quantities.py"):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("warmshell") :]) if "warmshell" in parts else Path(path).name


async def counted(driver_module: types.ModuleType, work: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    """Run `work` with the hook on; what it counted."""
    import warmshell

    driver_file = driver_module.__file__
    assert driver_file is not None
    counter = EntryCounter(driver_file, str(Path(driver_file).parent), str(Path(warmshell.__file__).parent))
    sys.setprofile(counter)
    try:
        await work()
    finally:
        sys.setprofile(None)
    return {
        "entries": sum(counter.entries.values()),
        "by_caller": dict(counter.entries),
        "by_callee": dict(counter.by_callee.most_common()),
        "modules_touched": len(counter.modules),
        "quantity_parses": sum(counter.quantity_parses.values()),
        "quantity_parses_by_caller": dict(counter.quantity_parses.most_common()),
    }


async def measured_create(gw: Any, driver_module: types.ModuleType) -> dict[str, Any]:
    """One warm-up create, then the counted one, each against a full pool; both deleted after."""
    from warmshell.api.v1 import sandbox_pb2 as pb

    spec = pb.SandboxSpec(environment=WARM_ENV, resources=pb.Resources(**SPEC_RESOURCES))

    async def full() -> None:
        async with asyncio.timeout(60):
            while not any(p.name == POOL and p.idle >= REPLICAS for p in gw.gateway.parts.driver.pools()):
                await asyncio.sleep(0.01)  # the idle count has no change notification

    async def create(name: str) -> None:
        await gw.create(name=name, spec=spec)
        ready = await gw.wait_ready(name, timeout=60)
        if ready.status.allocation != "warm" or ready.status.phase != pb.SANDBOX_PHASE_READY:
            raise SystemExit(f"the measured create was not a warm Ready one:\n{ready}")

    await full()
    await create("warm-up")
    await full()
    result = await counted(driver_module, lambda: create("measured"))
    for name in ("warm-up", "measured"):
        await gw.delete(name)
    return result


async def local_entries() -> dict[str, Any]:
    from tests.helpers.gateway import running_gateway
    from warmshell.drivers.local import driver as local_driver

    with tempfile.TemporaryDirectory(prefix="ws-entries-") as tmp:
        pools = Path(tmp) / "pools"
        pools.mkdir()
        (pools / f"{POOL}.toml").write_text(
            f'version = 1\nworkspace = "default"\nreplicas = {REPLICAS}\nimage = ""\n[environment]\nFOO = "bar"\n'
            '[resources]\ncpu = "0.5"\nmemory = "256Mi"\n'
        )
        settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1, **QUIET}
        async with running_gateway(Path(tmp) / "state", **settings) as gw:
            return await measured_create(gw, local_driver)


async def kubernetes_entries() -> dict[str, Any]:
    from kubesim.controllers import client as kc
    from tests.helpers.gateway import running_gateway
    from tests.helpers.kubesim_process import kubesim_process
    from tests.integration.drivers_kubernetes.conftest import IMAGE, NAMESPACE, driver_config, gateway_settings
    from warmshell.core.fingerprints import shape_of
    from warmshell.core.models import Resources, SandboxSpec
    from warmshell.drivers.kubernetes import driver as kubernetes_driver
    from warmshell.drivers.kubernetes.warm import warmpools

    async with kubesim_process("fast") as cluster:
        with tempfile.TemporaryDirectory(prefix="ws-entries-k8s-") as tmp:
            state = Path(tmp) / "state"
            # Built as the gateway builds a request's shape, so it reads the same on both revisions.
            pool_spec = SandboxSpec(environment=WARM_ENV, resources=Resources(cpu="0.5", memory="256Mi"))
            shape = shape_of("default", pool_spec, default_image=IMAGE)
            template, pool = warmpools.render_pool_pair(
                driver_config(cluster, state), name=POOL, namespace=NAMESPACE, shape=shape, replicas=REPLICAS
            )
            await cluster.admin.create(kc.TEMPLATES, NAMESPACE, template)
            await cluster.admin.create(kc.POOLS, NAMESPACE, pool)
            async with running_gateway(state, **(gateway_settings(cluster, state) | QUIET)) as gw:
                result = await measured_create(gw, kubernetes_driver)
            await cluster.admin.delete(kc.POOLS, NAMESPACE, POOL)
    return result


def measure_here() -> dict[str, Any]:
    """Both drivers, on the code this interpreter imports."""
    import warmshell

    package = Path(warmshell.__file__).parent
    result: dict[str, Any] = {"source": str(package)}
    for name, run in (("local", local_entries), ("kubernetes", kubernetes_entries)):
        result[name] = {"shape": shape_of_file(package / "drivers" / name / "driver.py"), **asyncio.run(run())}
    return result


def measure_baseline(revision: str) -> dict[str, Any]:
    """The same measurement on an older revision of this repository, in a subprocess importing
    its code (a temporary `git archive` of it, with its own agent built)."""
    with tempfile.TemporaryDirectory(prefix="ws-entries-base-") as tmp:
        directory = Path(tmp) / "tree"
        directory.mkdir()
        archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
        subprocess.run([str(directory / "scripts" / "build-agent")], cwd=directory, check=True)
        script = directory / "bench" / "_driver_entries_probe.py"
        script.write_text(Path(__file__).read_text())
        out = Path(tmp) / "measured.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory / "src"), str(directory)])}
        subprocess.run([sys.executable, str(script), "--json-out", str(out)], env=env, cwd=directory, check=True)
        measured: dict[str, Any] = json.loads(out.read_text())
        if not measured.pop("source").startswith(str(directory)):
            raise SystemExit(f"the baseline did not import warmshell from its own tree ({directory})")
    return measured


def table(runs: dict[str, dict[str, Any]], load: str) -> str:
    labels = list(runs)
    lines = [
        "Issue 17: `driver.py` per driver, and entries into it during one warm create -> Ready "
        "(sys.setprofile, coroutine resumptions count as calls: upper bounds).",
        "",
        f"Load average at the end: {load} (2 cores, shared with other engineers' runs).",
        "",
        "| | " + " | ".join(f"{driver}: {label}" for driver in DRIVERS for label in labels) + " |",
        "|---|" + "---|" * (len(DRIVERS) * len(labels)),
    ]

    def row(title: str, value: Callable[[dict[str, Any]], object]) -> None:
        cells = [str(value(runs[label][driver])) for driver in DRIVERS for label in labels]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")

    row("lines", lambda r: r["shape"]["lines"])
    row("methods of the driver class", lambda r: r["shape"]["methods"])
    row(
        "longest functions",
        lambda r: ", ".join(f"`{f['name']}` {f['lines']}" for f in r["shape"]["longest"][:3]),
    )
    row("functions over 30 lines", lambda r: ", ".join(r["shape"]["over_30"]) or "none")
    row("entries into driver.py", lambda r: r["entries"])
    for group in ("gateway", "own components", "tasks on the loop", "other"):
        row(f"… from {group}", lambda r, g=group: r["by_caller"].get(g, 0))
    row("warmshell modules touched", lambda r: r["modules_touched"])
    row("quantities parsed", lambda r: r["quantity_parses"])
    lines.append("")
    for label in labels:
        for driver in DRIVERS:
            lines.append(
                f"Entries, {driver} ({label}): "
                + "; ".join(f"{callee} x{count}" for callee, count in runs[label][driver]["by_callee"].items())
            )
            parses = runs[label][driver]["quantity_parses_by_caller"]
            lines.append(f"Quantities parsed, {driver} ({label}): " + "; ".join(f"{w} x{n}" for w, n in parses.items()))
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", metavar="REV", help="an older git revision to measure in the same run")
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)  # the baseline's subprocess
    args = parser.parse_args()
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(measure_here()))
        return
    runs: dict[str, dict[str, Any]] = {}
    if args.baseline is not None:
        runs[f"before ({args.baseline})"] = measure_baseline(args.baseline)
    here = measure_here()
    del here["source"]
    runs["after" if args.baseline is not None else "this tree"] = here
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    write_results("driver_entries", {"runs": runs, "load_average": load}, table(runs, load))


if __name__ == "__main__":
    main()
