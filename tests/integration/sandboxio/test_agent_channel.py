"""The agent channel as a Unix socket path (a pod's two containers): the real C agent, PID 1 of its
own namespace, connects with ``--connect``; the supervisor's side accepts it alone, by its uid,
then unlinks the path; commands run through it as on the local driver's inherited socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from warmshell.drivers.local.runtime.launching import AGENT_BINARY
from warmshell.sandboxio.agentlink import AgentLink
from warmshell.sandboxio.agentlisten import AgentRefused, accept_agent

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

NOBODY = 65534


async def start_agent(path: Path) -> asyncio.subprocess.Process:
    """The agent as a workload container's PID 1 (bwrap only gives it the PID namespace)."""
    argv = ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--as-pid-1", "--die-with-parent"]
    return await asyncio.create_subprocess_exec(*argv, str(AGENT_BINARY), "--connect", str(path))


@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[tuple[AgentLink, Path, asyncio.subprocess.Process]]:
    path = tmp_path / "agent.sock"
    agent = await start_agent(path)  # before the listener: the agent waits for it
    connection = await accept_agent(path, uid=os.geteuid(), timeout=30)
    link = AgentLink(connection)
    try:
        yield link, path, agent
    finally:
        link.close()
        await asyncio.wait_for(agent.wait(), 10)


async def run(link: AgentLink, *command: str) -> tuple[int, bytes]:
    output = bytearray()

    async def sink(_stderr: bool, data: bytes) -> None:
        output.extend(data)

    ended = await link.run_streaming(list(command), env={"PATH": "/usr/bin:/bin"}, cwd="/", sink=sink)
    return ended.exit_code, bytes(output)


async def test_commands_run_through_the_connected_agent(channel: tuple[AgentLink, Path, object]) -> None:
    link, path, _ = channel
    assert await link.wait_hello() == 1
    assert await run(link, "sh", "-c", "echo $$; exit 3") == (3, b"2\n")
    assert await link.ping(5)
    # The listener is gone once the agent is in: nothing else can reach the supervisor.
    assert not path.exists()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as second, pytest.raises(FileNotFoundError):
        second.connect(str(path))


async def test_closing_the_channel_ends_the_agent_and_its_commands(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    agent = await start_agent(path)
    link = AgentLink(await accept_agent(path, uid=os.geteuid(), timeout=30))
    await link.wait_hello()
    started = asyncio.ensure_future(run(link, "sleep", "600"))
    await asyncio.sleep(0.2)
    link.close()
    assert await asyncio.wait_for(agent.wait(), 10) == 1  # non-zero: a pod restarts its container
    with pytest.raises(OSError, match="control socket was closed"):
        await started


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another uid needs root")
async def test_a_connection_from_another_uid_is_refused_and_the_agent_still_accepted() -> None:
    # Somewhere the other uid can reach (pytest's tmp_path is private to this one).
    base = Path(tempfile.mkdtemp(prefix="warmshell-channel-"))
    os.chmod(base, 0o755)
    path = base / "agent.sock"
    intruder_code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "while True:\n"
        "    try: s.connect(sys.argv[1]); break\n"
        "    except OSError: time.sleep(0.01)\n"
        "print(len(s.recv(64)), flush=True)\n"  # 0: closed by the supervisor, never spoken to
    )
    # The system's interpreter: this one (a checkout's virtualenv) may be closed to that uid.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    intruder = subprocess.Popen(
        [python, "-c", intruder_code, str(path)], user=NOBODY, stdout=subprocess.PIPE, text=True
    )
    try:
        accepting = asyncio.ensure_future(accept_agent(path, uid=os.geteuid(), timeout=30))
        out, _ = await asyncio.to_thread(intruder.communicate, timeout=30)
        assert out.strip() == "0"
        agent = await start_agent(path)
        link = AgentLink(await accepting)
        assert await link.wait_hello() == 1
        link.close()
        await asyncio.wait_for(agent.wait(), 10)
    finally:
        intruder.kill()
        intruder.wait()
        shutil.rmtree(base, ignore_errors=True)


async def test_no_agent_in_time_is_refused_and_leaves_no_listener(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    with pytest.raises(AgentRefused, match="no agent connected"):
        await accept_agent(path, uid=os.geteuid(), timeout=0.2)
    assert not path.exists()


async def test_finishing_ends_the_agent_with_status_0(tmp_path: Path) -> None:
    """The sandbox is over, not its supervisor lost: the pod's workload container completes."""
    path = tmp_path / "agent.sock"
    agent = await start_agent(path)
    link = AgentLink(await accept_agent(path, uid=os.geteuid(), timeout=30))
    await link.wait_hello()
    await link.finish()
    assert await asyncio.wait_for(agent.wait(), 10) == 0
    assert link.closed.done()
