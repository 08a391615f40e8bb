"""Compiling the sandbox agent (pid 1 of every local sandbox) and `warmshell-launch` from their C
sources beside this file: `scripts/build-agent` runs it in a checkout, the wheel build (`setup.py`)
runs it into the wheel, and an installed copy without them is built with
`python -m warmshell.drivers.local.runtime.agent.building`.

Standard library only, and no warmshell import: the wheel build loads this file before warmshell
is installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["BINARIES", "HERE", "HOW", "build", "compiler"]

HERE = Path(__file__).resolve().parent
# Each binary and its source, both in this directory.
BINARIES = {"warmshell-agent": "warmshell-agent.c", "warmshell-launch": "warmshell-launch.c"}
_FLAGS = ("-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror")
# The agent stays resident in every sandbox and pod, each pod with its own copy (an init container
# copies it into an emptyDir, whose pages no other pod shares): static against musl it maps
# ~60 KiB, against glibc ~700 KiB (glibc's static start-up touches most of its 670 KiB of text),
# which was half of what the two-container pod added per idle pod. Built with musl-gcc when it
# is installed (`scripts/build-agent` installs musl-tools), else with the compiler below.
_MUSL = ("warmshell-agent",)
# How to build them, for messages about a missing one.
HOW = (
    "python -m warmshell.drivers.local.runtime.agent.building (needs a C compiler; in a checkout: scripts/build-agent)"
)


def compiler() -> list[str] | None:
    """The C compiler: $CC (split as a shell would), else `cc`; None when it is not installed."""
    command = shlex.split(os.environ.get("CC", "")) or ["cc"]
    return command if shutil.which(command[0]) else None


def _static(cc: list[str]) -> list[str]:
    # Static when the C library's archive is installed, so the agent also runs inside image roots.
    found = subprocess.run([*cc, "-print-file-name=libc.a"], capture_output=True, text=True, check=False)
    archive = found.stdout.strip()
    return ["-static"] if "/" in archive and Path(archive).exists() else []


def build(out_dir: Path = HERE, *, cc: list[str] | None = None) -> list[Path]:
    """Compile every binary into `out_dir` (each replaced whole: a failed build keeps the old one).
    FileNotFoundError without a compiler; CalledProcessError when one fails (its errors on stderr)."""
    cc = cc or compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler: install one (e.g. apt-get install gcc libc6-dev) or set $CC")
    static = _static(cc)
    musl = shutil.which("musl-gcc") if "CC" not in os.environ else None
    built = []
    for name, source in BINARIES.items():
        target = out_dir / name
        partial = target.with_name(f"{name}.tmp")
        how = [musl, "-static"] if musl is not None and name in _MUSL else [*cc, *static]
        subprocess.run([how[0], *_FLAGS, *how[1:], "-o", str(partial), str(HERE / source)], check=True)
        os.replace(partial, target)
        built.append(target)
    return built


def main() -> int:
    """Build into this directory; prints what it built, or why it could not."""
    try:
        built = build()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in built:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
