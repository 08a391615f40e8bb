"""Import of a real Debian root into the local image store beside `tar -x` of the same layer
(issue 30: within 1.5x of tar).

The root is the tests' cached mmdebstrap minbase tarball (~170 MB, ~9,000 entries; built once per
machine by tests/helpers/debian.py, which needs mmdebstrap and the apt mirror), saved as a
one-layer `docker save` tarball. Each round runs, in alternating order, one import in a fresh
store (a child process: its wall time and CPU, user and system, from `getrusage` around
`import_image` alone) and one `tar -x` of the layer tar into a fresh directory (its CPU from
`wait4`). The import verifies the layer's sha256 while it streams, which tar does not do.

Nothing is deleted between rounds: ext4 scans past inodes freed in the last ~30 s when it
allocates new ones, so a round right after a deletion would pay for the one before it.

    python bench/image_import.py [--rounds 5] [--before-src DIR]

`--before-src DIR` also imports with the `warmshell` package under DIR (an older tree's `src/`)
in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import debian  # noqa: E402

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore
store = ImageStore(Path(sys.argv[2]), max_bytes=4 << 30)
store.open()
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
import_image(store, Path(sys.argv[1]))
wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
                  "sys_s": after.ru_stime - before.ru_stime}))
"""


def _import(src: Path, source: Path, store: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(source), str(store)], env=env, check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def _tar(layer: Path, dest: Path) -> dict[str, float]:
    dest.mkdir()
    start = time.perf_counter()
    process = subprocess.Popen(["tar", "-x", "-f", str(layer), "-C", str(dest)])
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"tar -x exited {process.returncode}")
    return {"wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime}


def _row(label: str, runs: list[dict[str, float]], tar: dict[str, float]) -> str:
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["user_s"] + r["sys_s"] for r in runs)
    user = statistics.median(r["user_s"] for r in runs)
    system = statistics.median(r["sys_s"] for r in runs)
    return (
        f"| {label} | {len(runs)} | {wall:.2f} | {cpu:.2f} | {user:.2f} | {system:.2f} | "
        f"{wall / tar['wall_s']:.2f}x | {cpu / tar['cpu_s']:.2f}x |\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before-src", type=Path, help="also import with the warmshell package under DIR")
    args = parser.parse_args()
    layer = debian.debian_rootfs_tar()
    trees = {"import": ROOT / "src"}
    if args.before_src:
        trees["import (before)"] = args.before_src.resolve()
    runs: dict[str, list[dict[str, float]]] = {"tar -x": [], **{label: [] for label in trees}}
    work = Path(tempfile.mkdtemp(prefix="image-import-", dir=os.environ.get("BENCH_TMP")))
    try:
        source = work / "debian.tar"
        debian.write_debian_docker_save(source, layer, tag="debian:bookworm")
        for number in range(args.rounds):
            order = ["tar -x", *trees] if number % 2 == 0 else [*trees, "tar -x"]
            for label in order:
                dest = work / f"{number}-{len(runs[label])}-{label.replace(' ', '')}"
                result = _tar(layer, dest) if label == "tar -x" else _import(trees[label], source, dest)
                runs[label].append(result)
                print(label, {k: round(v, 2) for k, v in result.items()}, flush=True)
    finally:
        shutil.rmtree(work)
    _report(args, layer, runs)


def _report(args: argparse.Namespace, layer: Path, runs: dict[str, list[dict[str, float]]]) -> None:
    tar_runs = runs["tar -x"]
    tar = {
        "wall_s": statistics.median(r["wall_s"] for r in tar_runs),
        "cpu_s": statistics.median(r["user_s"] + r["sys_s"] for r in tar_runs),
    }
    table = (
        "| run | n | wall s (p50) | CPU s (p50) | user s | system s | wall / tar | CPU / tar |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    table += "".join(_row(label, r, tar) for label, r in runs.items())
    load = os.getloadavg()[0]
    table += (
        f"\nLayer: {layer.stat().st_size / 1e6:.0f} MB uncompressed tar, one-layer docker save tarball; "
        f"{args.rounds} rounds alternating; 1-minute load {load:.1f} at the end. The import also "
        "checks the layer's sha256 as it streams; `tar -x` checks nothing.\n"
    )
    data: dict[str, Any] = {"layer_bytes": layer.stat().st_size, "load": load, "runs": runs}
    write_results("image_import", data, table)


if __name__ == "__main__":
    main()
