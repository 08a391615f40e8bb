"""Start the real agent under the real bwrap layout, outside any driver (for protocol tests)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from warmshell.drivers.local.runtime import launching, sandboxing, seccomp

TEST_UID = 2_100_000 + os.getpid() % 10_000  # outside the drivers' default range


@contextlib.contextmanager
def raw_agent() -> Iterator[tuple[socket.socket, subprocess.Popen[bytes]]]:
    """A sandbox whose control socket the test holds as a plain blocking socket."""
    base = Path(tempfile.mkdtemp(prefix="warmshell-agent-test-"))
    os.chmod(base, 0o755)
    workspace = base / "workspace"
    workspace.mkdir(mode=0o700)
    agent = base / "agent"
    shutil.copyfile(launching.AGENT_BINARY, agent)
    os.chmod(agent, 0o755)
    uid = TEST_UID if os.geteuid() == 0 else None
    if uid is not None:
        os.chown(workspace, uid, uid)
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_end, write_end = os.pipe()
    os.write(write_end, seccomp.program())
    os.close(write_end)
    plan = sandboxing.host_root_plan(sandboxing.list_root(Path("/")), os.listdir("/etc"))
    layout = sandboxing.SandboxLayout(
        bwrap=shutil.which("bwrap") or "bwrap",
        plan=plan,
        workspace_dir=workspace,
        agent=agent,
        control_fd=child.fileno(),
        seccomp_fd=read_end,
        hostname="agent-test",
    )
    as_user = [str(launching.LAUNCH_BINARY), f"--uid={uid}", "--"] if uid is not None else []
    argv = [*as_user, *sandboxing.bwrap_argv(layout)]
    process = subprocess.Popen(argv, pass_fds=(child.fileno(), read_end), stdin=subprocess.DEVNULL)
    child.close()
    os.close(read_end)
    host.settimeout(10)
    try:
        yield host, process
    finally:
        host.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(base, ignore_errors=True)
