"""`warmshell install-agent DIR`: copy the static sandbox agent into DIR (from the warmshell image
into an `emptyDir` the workload container mounts read-only: the agent is then pid 1 of any
workload image, which needs nothing of its own for it).

A pod rendered by this version's driver has its init container run the agent's own
`warmshell-agent --install DIR` (the same copy, with no Python process); this command stays for
the pods of templates an older gateway rendered.

Standard library only: it runs in an init container, before anything else of the pod.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["AGENT_NAME", "BUILT_AGENT", "install", "main"]

AGENT_NAME = "warmshell-agent"
# The agent built into the package (the image puts it on PATH as `warmshell-agent`).
BUILT_AGENT = Path(__file__).resolve().parent / AGENT_NAME


def install(directory: Path, *, source: Path = BUILT_AGENT) -> Path:
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
