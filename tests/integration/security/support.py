"""What the red team's attacks share: a ready sandbox, a shell command run in it as its workload
would run it, and the check that the sandbox still works for real afterwards."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import sandbox_pb2 as pb


async def sandbox(gw: RunningGateway, name: str, spec: pb.SandboxSpec | None = None) -> pb.Sandbox:
    """Create `name` and wait until it is Ready."""
    await gw.create(name=name, spec=spec)
    ready = await gw.wait_ready(name)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
    return ready


async def sh(gw: RunningGateway, name: str, script: str, timeout: int = 0) -> tuple[int, str, str]:
    """Run `script` with /bin/sh in the sandbox: (exit code, stdout, stderr)."""
    code, out, err = await gw.exec(name, ["/bin/sh", "-c", script], timeout_seconds=timeout)
    return code, out.decode(), err.decode()


async def py(gw: RunningGateway, name: str, source: str, *args: str) -> tuple[int, str, str]:
    """Run a Python program in the sandbox (the host's python3, bound read-only)."""
    code, out, err = await gw.exec(name, ["python3", "-c", source, *args])
    return code, out.decode(), err.decode()


async def still_real(gw: RunningGateway, name: str) -> None:
    """The attack changed nothing: an exec still runs for real and says so."""
    assert await gw.exec(name, ["/bin/sh", "-c", "echo REAL; exit 7"]) == (7, b"REAL\n", b"")


def process_tree(root: int) -> set[int]:
    """`root` and every process below it (from /proc/*/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return tree
