"""Issue 31: what one more image layer costs a sandbox's start: `warmshell-launch` making an image
root of 0 to 3 layers (a mount namespace, the root's tmpfs, an idmapped read-only clone of each
layer, the overlay) and then running `/bin/true`, against the same launch with no image root.

    python bench/investigations/fork-timeline/launch_layers.py [--rounds 40]

Run as root (idmapped mounts); the layers are empty directories on ext4 (`--dir`), as a store's
are. The variants take turns, the order reversed each round. Wall ms (fork to exit, the mount
namespace's end included) and the launcher's CPU ms (getrusage of the reaped child).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the harness

from harness import summary, write_results

from warmshell.drivers.local.runtime.launching import LAUNCH_BINARY


def launch(rootfs: Path, layers: list[Path]) -> tuple[float, float]:
    argv = [str(LAUNCH_BINARY), "--uid=1234567"]
    if layers:
        argv += [f"--rootfs={rootfs}", "--root-size=67108864", *(f"--layer={layer}" for layer in layers)]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([*argv, "--", "/bin/true"], check=True)
    wall, after = (time.perf_counter() - start) * 1000, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: idmapped mounts need it")
    samples: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in range(4)}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        layers = [Path(tmp) / f"layer{n}" for n in range(3)]
        for layer in layers:
            (layer / "usr").mkdir(parents=True)
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        for turn in range(args.rounds):
            for count in range(4) if turn % 2 == 0 else reversed(range(4)):
                wall, cpu = launch(rootfs, layers[:count])
                samples[count][0].append(wall)
                samples[count][1].append(cpu)
    data: dict[str, Any] = {
        f"layers_{n}": {"wall_ms": summary(w), "cpu_ms": summary(c)} for n, (w, c) in samples.items()
    }
    data["load"] = os.getloadavg()[0]
    lines = ["| image root | wall p50 ms | p90 | launcher CPU p50 ms |", "|---|---|---|---|"]
    for n in range(4):
        wall, cpu = data[f"layers_{n}"]["wall_ms"], data[f"layers_{n}"]["cpu_ms"]
        what = f"{n} layer{'s' if n != 1 else ''}" if n else "none (no mount namespace)"
        lines.append(f"| {what} | {wall['p50']:.2f} | {wall['p90']:.2f} | {cpu['p50']:.2f} |")
    lines += ["", f"Load (1 min) at the end: {data['load']:.1f}."]
    write_results("launch_layers", data, "\n".join(lines))


if __name__ == "__main__":
    main()
