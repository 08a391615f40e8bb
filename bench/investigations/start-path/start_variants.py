"""One sandbox start (`warmshell-launch` + bwrap with the driver's layout, running `/bin/true`)
with the parts a start has gained switched on in turn, rounds alternating: wall and CPU (wait4:
the launcher, bwrap and its children) per variant.

    python bench/investigations/start-path/start_variants.py [--rounds 20]

- `plain`: the layout `bench/burst.py` times (staged /etc, the launcher's rlimits and uid);
- `cgroup`: placed in a fresh cgroup (v1: one `cgroup.procs` write per hierarchy) by the launcher;
- `egress`: the sandbox's egress directory bound read-only;
- `egress+bundle`: and a copy of the host's CA bundle bound over the system one;
- all three.
Run as root on a cgroup v1 host (as this project's hosts are).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: burst's layout, the harness
import burst
from harness import write_results

from warmshell.core import egress
from warmshell.drivers.local.runtime import cgroups, cgroups_v1, seccomp

VARIANTS = ("plain", "cgroup", "egress", "egress+bundle", "cgroup+egress+bundle")


def measure(rounds: int) -> dict[str, Any]:
    backend = cgroups_v1.detect(gateway="start-variants")
    if isinstance(backend, cgroups.Unavailable):
        raise SystemExit(f"no cgroup v1 hierarchy to write: {backend.message}")
    limits = cgroups.Limits(cpu_millis=1000, memory_bytes=512 << 20, pids=256)
    program = seccomp.program()
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="ws-variants-") as tmp:
        base = burst.bwrap_argvs(Path(tmp))["now"]
        egress_dir = Path(tmp) / "egress"
        egress_dir.mkdir(mode=0o700)
        os.chown(egress_dir, 2_000_000, 2_000_000)  # the layout's sandbox uid
        bundle = egress_dir / egress.SYSTEM_BUNDLE_COPY
        shutil.copyfile(egress.SYSTEM_BUNDLE, bundle)
        os.chmod(bundle, 0o644)
        for round_ in range(rounds):
            for name in VARIANTS:
                argv, group = list(base), None
                if "cgroup" in name:
                    group = backend.create(f"v{round_}", limits)
                    argv[1:1] = [f"--cgroup={procs}" for procs in group.procs_files]
                extra = ["--ro-bind", str(egress_dir), egress.SANDBOX_DIR] if "egress" in name else []
                extra += ["--ro-bind", str(bundle), egress.SYSTEM_BUNDLE] if "bundle" in name else []
                argv[-2:-2] = extra  # before `-- /bin/true`
                wall, cpu = burst.timed_start(argv, program)
                samples[name][0].append(wall)
                samples[name][1].append(cpu)
                if group is not None:
                    backend.remove(group)
    backend.close()
    return {
        name: {"wall_ms_p50": statistics.median(w), "cpu_ms_p50": statistics.median(c), "n": len(w)}
        for name, (w, c) in samples.items()
    } | {"load": [round(x, 2) for x in os.getloadavg()]}


def table(data: dict[str, Any]) -> str:
    out = "| variant | wall p50 ms | CPU p50 ms | n |\n|---|---|---|---|\n"
    for name in VARIANTS:
        v = data[name]
        out += f"| {name} | {v['wall_ms_p50']:.2f} | {v['cpu_ms_p50']:.2f} | {v['n']} |\n"
    return out + f"\nLoad at the end {data['load']} (a shared 2-core machine).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="rounds, each one start per variant (default 20)")
    parser.add_argument("--name", default="start_variants", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    data = measure(args.rounds)
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
