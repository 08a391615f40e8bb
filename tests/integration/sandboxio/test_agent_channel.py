"""The agent channel as a Unix socket path (a pod's two containers): the real C agent, PID 1 of its
own namespace, connects with ``--connect``; the supervisor's side accepts it alone, by its uid,
then unlinks the path; commands run through it as on the local driver's inherited socket."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from warmshell.drivers.local.runtime.launching import AGENT_BINARY
from warmshell.sandboxio import agentwire
from warmshell.sandboxio.agentlink import AgentError, AgentLink
from warmshell.sandboxio.agentlisten import AgentRefused, accept_agent
from warmshell.sandboxio.rootfs import Root

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

NOBODY = 65534


async def start_agent(path: Path, *mounts: str) -> asyncio.subprocess.Process:
    """The agent as a workload container's PID 1 (bwrap gives it the PID namespace, and a mount
    namespace with `mounts`, bwrap options, of its own)."""
    argv = ["bwrap", "--dev-bind", "/", "/", *mounts, "--unshare-pid", "--as-pid-1", "--die-with-parent"]
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


async def test_files_are_reached_in_the_agents_own_mount_namespace(tmp_path: Path) -> None:
    """A pod's supervisor serves files under the root the agent sends: what is mounted in the
    workload's namespace only is what it reads and writes, not what its own namespace has there."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "host-only").write_text("the supervisor's side\n")
    path = tmp_path / "agent.sock"
    agent = await start_agent(path, "--tmpfs", str(private))
    link = AgentLink(await accept_agent(path, uid=os.geteuid(), timeout=30))
    try:
        await link.wait_hello()
        assert await run(link, "sh", "-c", f"echo workload-only > {private}/marker") == (0, b"")
        root = Root(await link.open_root())
        try:
            fd, size = root.open_read(f"{private}/marker")
            assert os.read(fd, 100) == b"workload-only\n"
            assert size == 14
            os.close(fd)
            with pytest.raises(FileNotFoundError):
                root.open_read(f"{private}/host-only")
            pending = root.begin_write(f"{private}/written", 0o644, False)
            os.write(pending.fd, b"from the files api\n")
            root.commit(pending)
        finally:
            os.close(root.fd)
        assert await run(link, "cat", f"{private}/written") == (0, b"from the files api\n")
        assert not (private / "written").exists()
        assert not (private / "marker").exists()
    finally:
        link.close()
        await asyncio.wait_for(agent.wait(), 10)


class FakeAgent:
    """The agent's end of a channel, played by the test: a hostile or broken agent."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = theirs
        self.link = AgentLink(ours)
        self.say(agentwire.Kind.HELLO, 0, 1, agentwire.VERSION)

    def say(self, kind: int, record_id: int, a: int = 0, b: int = 0, fds: tuple[int, ...] = ()) -> None:
        socket.send_fds(self.sock, [struct.pack("=4I", kind, record_id, a, b)], list(fds))

    async def asked(self) -> tuple[int, int]:
        data = await asyncio.get_running_loop().sock_recv(self.sock, 64)
        kind, record_id, _, _ = struct.unpack("=4I", data)
        return kind, record_id


@pytest.fixture
async def fake() -> AsyncIterator[FakeAgent]:
    agent = FakeAgent()
    agent.sock.setblocking(False)
    await agent.link.wait_hello()
    try:
        yield agent
    finally:
        agent.link.close()
        agent.sock.close()


async def test_a_root_that_is_no_directory_or_a_pseudo_fs_is_refused(fake: FakeAgent, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for sent, error in ((str(tmp_path / "file"), "no directory"), ("/proc/self", "pseudo file system")):
        opening = asyncio.ensure_future(fake.link.open_root())
        kind, record_id = await fake.asked()
        assert kind == agentwire.Kind.ROOT
        fd = os.open(sent, os.O_PATH)
        fake.say(agentwire.Kind.ROOT_DIR, record_id, fds=(fd,))
        os.close(fd)
        with pytest.raises(OSError, match=error):
            await opening
    assert not fake.link.closed.done()  # refused, not a broken protocol
    opening = asyncio.ensure_future(fake.link.open_root())
    _, record_id = await fake.asked()
    fake.say(agentwire.Kind.ROOT_DIR, record_id, errno.EACCES)
    with pytest.raises(AgentError, match="cannot open its root"):
        await opening


@pytest.mark.parametrize("case", ["fd on a PONG", "unasked", "errno and fd", "no fd"])
async def test_an_fd_where_none_belongs_ends_the_channel(fake: FakeAgent, tmp_path: Path, case: str) -> None:
    fd = os.open(tmp_path, os.O_PATH)
    try:
        if case == "fd on a PONG":
            pinging = asyncio.ensure_future(fake.link.ping(5))
            _, record_id = await fake.asked()
            fake.say(agentwire.Kind.PONG, record_id, fds=(fd,))
            assert not await pinging
        elif case == "unasked":
            fake.say(agentwire.Kind.ROOT_DIR, 1, fds=(fd,))
        else:
            opening = asyncio.ensure_future(fake.link.open_root())
            _, record_id = await fake.asked()
            fake.say(agentwire.Kind.ROOT_DIR, record_id, errno.EACCES if case == "errno and fd" else 0,
                     fds=(fd,) if case == "errno and fd" else ())  # fmt: skip
            with pytest.raises(AgentError, match="protocol"):
                await opening
    finally:
        os.close(fd)
    await asyncio.wait_for(asyncio.shield(fake.link.closed), 5)


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="musl-tools not installed: the agent links glibc")
async def test_an_idle_agent_maps_little_of_its_binary(tmp_path: Path) -> None:
    """Each pod has its own copy of the agent (an emptyDir), so every page it maps is that pod's
    alone: linked against musl an idle agent maps ~60 KiB, where glibc's static start-up
    mapped ~700 KiB."""
    copy = tmp_path / "warmshell-agent"
    shutil.copy(AGENT_BINARY, copy)  # a file of its own, as in a pod: no page shared with another
    path = tmp_path / "agent.sock"
    argv = ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--as-pid-1", "--die-with-parent"]
    agent = await asyncio.create_subprocess_exec(*argv, str(copy), "--connect", str(path))
    link = AgentLink(await accept_agent(path, uid=os.geteuid(), timeout=30))
    try:
        await link.wait_hello()
        assert await link.ping(5)
        [pid] = map(int, Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split())
        rollup = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
        assert int(rollup["Pss"].split()[0]) < 200, rollup["Pss"]  # KiB
    finally:
        link.close()
        await asyncio.wait_for(agent.wait(), 10)
