"""What placing the system CA bundle costs a member start, the two designs alternating: `copy`
(each start copied the host's bundle into its egress directory, and bwrap bound it over the host's
/etc/ssl, itself a bind of its own) against `link` (the staged /etc holds a copy of /etc/ssl whose
bundle is a symlink into the egress directory; each start makes one symlink there, no bind).

    python bench/investigations/start-path/ca_placement.py [--rounds 40]

Per start and design: the gateway's side (making the bundle or the link in a fresh egress
directory on a tmpfs, and removing the directory at the sandbox's end: this thread's CPU) and
one sandbox start with the driver's layout running `/bin/true` (the launcher, bwrap and its
children: CPU from wait4, and wall). Run as root (a sandbox uid) or as a user alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: burst's layout, the harness
import burst
from harness import write_results

from warmshell.core import egress
from warmshell.drivers.local.runtime import etcstage, seccomp

DESIGNS = ("copy", "link")
_SANDBOX_UID = 2_000_000  # the uid `burst.bwrap_argvs` runs a root's sandboxes as


def _copy_bundle(directory: Path) -> None:
    """The earlier per-start copy: the host's bundle's bytes by sendfile into a new 0644 file."""
    with open(egress.SYSTEM_BUNDLE, "rb") as reading:
        fd = os.open(directory / egress.SYSTEM_BUNDLE_COPY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            size, offset = os.fstat(reading.fileno()).st_size, 0
            while offset < size and (sent := os.sendfile(fd, reading.fileno(), offset, size - offset)):
                offset += sent
        finally:
            os.close(fd)


def _one(design: str, argv: list[str], runtime: Path, index: int, program: bytes) -> tuple[float, float, float]:
    """(gateway-side CPU ms, sandbox start CPU ms, its wall ms) of one start."""
    directory = runtime / f"li-{index}.egress"
    started = time.thread_time()
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, _SANDBOX_UID, _SANDBOX_UID)
    if design == "copy":
        _copy_bundle(directory)
        extra = ["--ro-bind", "/etc/ssl", "/etc/ssl", "--ro-bind", str(directory / egress.SYSTEM_BUNDLE_COPY)]
        extra.append(egress.SYSTEM_BUNDLE)
    else:
        etcstage.link_system_bundle(directory)
        extra = []
    host = time.thread_time() - started
    command = list(argv)
    command[-2:-2] = ["--ro-bind", str(directory), egress.SANDBOX_DIR, *extra]  # before `-- /bin/true`
    wall, cpu = burst.timed_start(command, program)
    started = time.thread_time()
    shutil.rmtree(directory)
    host += time.thread_time() - started
    return host * 1000, cpu, wall


def measure(rounds: int) -> dict[str, Any]:
    program = seccomp.program()
    samples: dict[str, list[tuple[float, float, float]]] = {design: [] for design in DESIGNS}
    with tempfile.TemporaryDirectory(prefix="ws-ca-") as tmp, tempfile.TemporaryDirectory(dir="/dev/shm") as runtime:
        os.chmod(runtime, 0o711)
        argv = burst.bwrap_argvs(Path(tmp))["now"]
        for round_ in range(rounds):
            for design in DESIGNS:
                samples[design].append(_one(design, argv, Path(runtime), round_, program))
    return {
        design: {
            "gateway_cpu_ms_p50": statistics.median(s[0] for s in runs),
            "start_cpu_ms_p50": statistics.median(s[1] for s in runs),
            "start_wall_ms_p50": statistics.median(s[2] for s in runs),
            "n": len(runs),
        }
        for design, runs in samples.items()
    } | {"load": [round(x, 2) for x in os.getloadavg()]}


def table(data: dict[str, Any]) -> str:
    out = "| design | gateway CPU p50 ms | start CPU p50 ms | start wall p50 ms | n |\n|---|---|---|---|---|\n"
    for design in DESIGNS:
        d = data[design]
        out += f"| {design} | {d['gateway_cpu_ms_p50']:.3f} | {d['start_cpu_ms_p50']:.2f} "
        out += f"| {d['start_wall_ms_p50']:.2f} | {d['n']} |\n"
    return out + f"\nLoad at the end {data['load']} (a shared 2-core machine).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="rounds, each one start per design (default 40)")
    parser.add_argument("--name", default="ca_placement", help="results/NAME.{json,md} beside this script")
    args = parser.parse_args()
    data = measure(args.rounds)
    write_results(args.name, data, table(data))


if __name__ == "__main__":
    main()
