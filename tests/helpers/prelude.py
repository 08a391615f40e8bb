"""Starting a command from a test process after a little Python of its own, without a preexec_fn.

A test process has gRPC's threads, and one of them may hold a lock at the moment of a fork: Python
run in the child before exec (a `preexec_fn`) can then wait for it forever (in CI, twice, a child
sat with an empty log until its start timed out). So the child is a fresh interpreter that runs
the prelude and then execs the command, and nothing runs between fork and exec in the test
process."""

from __future__ import annotations

import sys

__all__ = ["after_prelude"]


def after_prelude(prelude: str, argv: list[str]) -> list[str]:
    """An argv that runs `prelude` (Python; `os` and `sys` imported) in a fresh interpreter,
    then execs `argv` in its place (what the prelude set that survives exec stays)."""
    code = f"import os, sys\n{prelude}\nos.execv(sys.argv[1], sys.argv[1:])\n"
    return [sys.executable, "-c", code, *argv]
