"""`warmshell install-agent DIR`: copy the static sandbox agent into DIR (a Kubernetes pod's init
container, from the warmshell image into an `emptyDir` the workload container mounts read-only:
the agent is then pid 1 of any workload image, which needs nothing of its own for it).

Standard library only: it runs in an init container, before anything else of the pod.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["AGENT_NAME", "install", "main"]

AGENT_NAME = "warmshell-agent"
_BUILT = Path(__file__).resolve().parent / AGENT_NAME


def install(directory: Path, *, source: Path = _BUILT) -> Path:
    """Copy the agent to `directory` (replaced whole, mode 0755) and return its path."""
    target = directory / AGENT_NAME
    partial = directory / f".{AGENT_NAME}.tmp"
    shutil.copyfile(source, partial)
    os.chmod(partial, 0o755)
    os.replace(partial, target)
    return target


def main(argv: list[str]) -> int:
    """Entry point: exactly one argument, the directory; 2 on a usage error, 1 if the copy fails."""
    if len(argv) != 1:
        print("usage: warmshell install-agent DIRECTORY", file=sys.stderr)
        return 2
    try:
        print(install(Path(argv[0])))
    except OSError as exc:
        print(f"warmshell install-agent: {exc}", file=sys.stderr)
        return 1
    return 0
