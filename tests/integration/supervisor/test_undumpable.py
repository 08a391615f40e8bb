"""Attacks on a running supervisor from a process of the same uid (the Kubernetes workload's
position: same container, same uid, no CAP_SYS_PTRACE): reading `/proc/<pid>/mem` and
`environ` and ptrace-attaching are refused once it has read its credential. The same attack on
an ordinary process of that uid succeeds, so the attack itself is sound."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import agents
from tests.helpers.grpc import serve_for
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc

# An unprivileged uid when the tests run as root (root has CAP_SYS_PTRACE and may read anything).
UID = 65534 if os.geteuid() == 0 else os.geteuid()
GID = 65534 if os.geteuid() == 0 else os.getegid()
CREDENTIAL = "eyJhbGciOiJub25lIn0.c3RvbGVu.bWU"

pytestmark = pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="dropping to an unprivileged uid needs setpriv"
)

ATTACK = r"""
import ctypes, json, sys
pid = int(sys.argv[1])
found = {}
for name in ("mem", "environ"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            found[name] = "read" if name == "mem" or handle.read() is not None else "empty"
    except OSError as exc:
        found[name] = f"denied: {exc.strerror}"
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
    found["ptrace"] = "attached"
    import os; os.waitpid(pid, 0)
    libc.ptrace(PTRACE_DETACH, pid, None, None)
else:
    found["ptrace"] = "denied"
print(json.dumps(found))
"""


class ParkingGateway(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Takes a registration and never answers it (a warm pool member's wait)."""

    def __init__(self) -> None:
        self.registered = asyncio.Event()

    async def RegisterSupervisor(self, request: Any, context: Any) -> AsyncIterator[spb.SupervisorActivationMessage]:
        assert request.bootstrap_credential == CREDENTIAL
        self.registered.set()
        await asyncio.Event().wait()
        yield spb.SupervisorActivationMessage()  # pragma: no cover - never reached


def _as_victim_uid(argv: list[str]) -> list[str]:
    """`argv` run as the victim's uid, with no capabilities and no supplementary groups."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", *argv]


def _attack(pid: int) -> dict[str, str]:
    argv = _as_victim_uid([sys.executable, "-c", ATTACK, str(pid)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    return dict(json.loads(done.stdout))


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    # The unprivileged supervisor reads its token here (pytest's tmp_path has 0700 parents).
    with tempfile.TemporaryDirectory(prefix="ws-undumpable-") as tmp:
        Path(tmp).chmod(0o755)
        yield Path(tmp)


async def test_the_supervisor_cannot_be_read_or_traced_by_its_own_uid(shared_dir: Path) -> None:
    token = shared_dir / "token"
    token.write_text(CREDENTIAL + "\n")
    token.chmod(0o644)
    channel = shared_dir / "channel"  # where the supervisor listens for its agent: the victim's
    channel.mkdir()
    if os.geteuid() == 0:
        os.chown(channel, UID, GID)
    gateway = ParkingGateway()
    async with serve_for(gateway) as served:
        socket_path = Path(served.address.removeprefix("unix://"))
        socket_path.parent.chmod(0o755)
        socket_path.chmod(0o777)
        env = {
            "PATH": "/usr/bin:/bin",
            "WARMSHELL_GATEWAY": served.address,
            "WARMSHELL_BOOTSTRAP_FILE": str(token),
            "WARMSHELL_RESTART_POLICY": "OnFailure",
            "WARMSHELL_AGENT_SOCKET": str(channel / "agent.sock"),
        }
        supervisor = subprocess.Popen(
            _as_victim_uid([sys.executable, "-m", "warmshell", "supervisor"]), env=env, stderr=subprocess.PIPE
        )
        agent = agents.start_agent(channel / "agent.sock", wrap=_as_victim_uid([]))
        control = subprocess.Popen(_as_victim_uid(["sleep", "60"]), env={"SECRET": "x"})
        try:
            try:
                async with asyncio.timeout(30):
                    await gateway.registered.wait()  # it has read its credential and used it
            except TimeoutError:
                supervisor.kill()
                assert supervisor.stderr is not None
                raise AssertionError(f"the supervisor never registered: {supervisor.stderr.read()!r}") from None
            attacked = await asyncio.to_thread(_attack, supervisor.pid)
            assert attacked["mem"].startswith("denied"), attacked
            assert attacked["environ"].startswith("denied"), attacked
            assert attacked["ptrace"] == "denied", attacked
            # The same attack on an ordinary process of that uid works.
            assert await asyncio.to_thread(_attack, control.pid) == {
                "mem": "read",
                "environ": "read",
                "ptrace": "attached",
            }
            assert supervisor.poll() is None, "the supervisor survived the attempts"
        finally:
            for process in (supervisor, control, agent):
                process.kill()
                process.wait()
            assert supervisor.stderr is not None
            supervisor.stderr.close()
