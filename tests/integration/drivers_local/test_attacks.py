"""Attacks on a local sandbox from inside it, each kept as a regression test.

A real gateway, real bwrap'd sandboxes and their real host-side supervisors; every attack is a
command run in the sandbox exactly as a workload would run it. Each must be refused or find
nothing to act on, and afterwards the sandbox's real exec still returns the real output."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = [needs_bwrap, pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 in /usr")]


@pytest.fixture
async def gw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningGateway]:
    # Something of the gateway's own environment that must not reach any workload.
    monkeypatch.setenv("PYTHONPATH", "/gateway/leak")
    monkeypatch.setenv("WARMSHELL_LEAK", "gateway-secret")
    async with running_gateway(tmp_path / "state") as running:
        yield running


async def sandbox(gw: RunningGateway, name: str = "victim") -> None:
    await gw.create(name=name)
    ready = await gw.wait_ready(name)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready


async def sh(gw: RunningGateway, script: str, name: str = "victim") -> tuple[int, str, str]:
    code, out, err = await gw.exec(name, ["/bin/sh", "-c", script])
    return code, out.decode(), err.decode()


async def still_real(gw: RunningGateway, name: str = "victim") -> None:
    """The attack changed nothing: an exec still runs for real and says so."""
    assert await gw.exec(name, ["/bin/sh", "-c", "echo REAL; exit 7"]) == (7, b"REAL\n", b"")


async def test_host_secrets_and_homes_are_not_there(gw: RunningGateway) -> None:
    await sandbox(gw)
    for path in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/machine-id", "/etc/ssh"):
        code, _, err = await sh(gw, f"cat {path} || ls {path}")
        assert code != 0, path
        assert "No such file" in err, (path, err)
    for path in ("/root", "/home", "/var", "/srv", "/opt", "/mnt", "/media", "/sys", "/boot"):
        code, _, err = await sh(gw, f"ls -d {path}")
        assert code != 0, path
        assert "No such file" in err, (path, err)
    listing = (await sh(gw, "ls /"))[1].split()
    assert sorted(listing) == ["bin", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "tmp", "usr", "workspace"]
    await still_real(gw)


async def test_another_gateways_state_and_socket_are_out_of_reach(gw: RunningGateway, tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "other") as other:
        state = other.gateway.paths.root
        await sandbox(gw)
        for path in (state / "api-token", state / "signing-key.pem", state / "warmshell.db", state / "instances"):
            code, _, _ = await sh(gw, f"ls -l {path}")
            assert code != 0, path
        connect = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print(type(e).__name__); sys.exit(3)\n"
        )
        for sock in (other.gateway.paths.socket, other.gateway.paths.supervisor_socket, gw.gateway.paths.socket):
            code, out, _ = await gw.exec("victim", ["python3", "-c", connect, str(sock)])
            assert (code, out.decode()) == (3, "FileNotFoundError\n"), sock
        # Not through the network either: the sandbox's loopback is its own.
        tcp = (
            "import socket, sys\n"
            "try:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)\n"
            "except OSError as e:\n    print(type(e).__name__); sys.exit(3)\n"
        )
        code, out, _ = await gw.exec("victim", ["python3", "-c", tcp, str(other.gateway.http_port)])
        assert (code, out.decode()) == (3, "ConnectionRefusedError\n")
        await still_real(gw)


async def test_no_unix_socket_or_credential_anywhere(gw: RunningGateway) -> None:
    await sandbox(gw)
    _, out, _ = await sh(gw, "find / -type s 2>/dev/null; cat /proc/net/unix | tail -n +2")
    assert out == "", out
    _, out, _ = await sh(gw, "env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'")
    for secret in ("wsl1.", "WARMSHELL_GATEWAY", "BOOTSTRAP"):
        assert secret not in out, secret
    assert "eyJhbGciOi" not in out, "no sandbox token (a JWT) in any environment"
    _, out, _ = await sh(gw, "grep -rl -e 'wsl1\\.li-' -e eyJhbGciOi /workspace /tmp /run /etc 2>/dev/null; echo done")
    assert out == "done\n", out
    await still_real(gw)


async def test_pid_1_gives_away_nothing(gw: RunningGateway) -> None:
    await sandbox(gw)
    for attempt in ("head -c 16 /proc/1/mem", "cat /proc/1/environ", "cat /proc/1/maps", "ls -l /proc/1/cwd/"):
        code, out, err = await sh(gw, attempt)
        assert code != 0, attempt
        assert out == "", (attempt, out)
        assert "Permission denied" in err, (attempt, err)
    assert await sh(gw, "readlink /proc/1/fd/0 /proc/1/fd/3 /proc/1/exe") == (1, "", "")
    await still_real(gw)


async def test_pid_1_cannot_be_traced_stopped_or_killed(gw: RunningGateway) -> None:
    await sandbox(gw)
    trace = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE\n"
        "    print(libc.ptrace(request, 1, 0, 0), ctypes.get_errno())\n"
    )
    _, out, _ = await gw.exec("victim", ["python3", "-c", trace])
    assert out.decode().split("\n")[:2] == ["-1 1", "-1 1"]  # EPERM
    _, out, _ = await sh(gw, "kill -STOP 1; kill -KILL 1; sleep 0.1; grep State /proc/1/status")
    assert "State:\tS" in out, out
    # Killing everything it can see ends only the workload's own processes.
    await sh(gw, "kill -KILL -1")
    await still_real(gw)


async def test_no_new_namespaces(gw: RunningGateway) -> None:
    await sandbox(gw)
    for attempt in ("unshare -U true", "unshare -r true", "unshare -m true", "unshare -n true", "unshare -p -f true"):
        code, _, err = await sh(gw, attempt)
        assert code != 0, (attempt, err)
    raw = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print(libc.syscall(165, b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"  # mount
    )
    code, out, _ = await gw.exec("victim", ["python3", "-c", raw])
    assert out.decode().split() == ["-1", "1", "-1", "1"]
    await still_real(gw)


async def test_the_root_is_read_only_the_workspace_is_not(gw: RunningGateway) -> None:
    await sandbox(gw)
    code, _, _ = await sh(gw, "touch /usr/x || touch /etc/x || touch /x")
    assert code != 0
    assert await sh(gw, "echo data > /workspace/f && cat /workspace/f") == (0, "data\n", "")


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox needs a gateway run as root")
async def test_each_sandbox_runs_as_its_own_unprivileged_host_uid(gw: RunningGateway) -> None:
    await sandbox(gw, "a")
    await sandbox(gw, "b")
    uids = []
    for name in ("a", "b"):
        record = await gw.get(name)
        instance = gw.gateway.parts.driver._fleet.instances[record.status.instance_id]  # type: ignore[attr-defined]
        pid = await instance.process.sandbox_pid()
        status = Path(f"/proc/{pid}/status").read_text()
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        uids.append(uid)
        # Its /workspace (its own tmpfs, seen from the host) is its uid's alone.
        workspace = Path(f"/proc/{pid}/root/workspace").stat()
        assert (workspace.st_uid, workspace.st_mode & 0o777) == (uid, 0o700)
    assert uids[0] != uids[1]
    assert all(uid >= 1000 for uid in uids)


async def test_environments_come_from_the_request_alone(gw: RunningGateway) -> None:
    await gw.create(name="envs", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
    assert (await gw.wait_ready("envs")).status.phase == pb.SANDBOX_PHASE_READY
    code, out, _ = await gw.exec("envs", ["env"], environment={"PER_EXEC": "1"})
    env = dict(line.split("=", 1) for line in out.decode().splitlines())
    assert code == 0
    assert set(env) == {"PATH", "HOME", "FOO", "PER_EXEC", "WARMSHELL_SANDBOX_ID", "WARMSHELL_SANDBOX_NAME"}
    assert (env["FOO"], env["HOME"], env["WARMSHELL_SANDBOX_NAME"]) == ("bar", "/workspace", "envs")


async def test_the_shared_staged_etc_cannot_be_changed_for_the_next_sandbox(gw: RunningGateway) -> None:
    # Every sandbox on the host root shares one staged /etc, its directories copied in (etcstage):
    # a workload that could write there would reach every other sandbox. Write, replace, link and
    # chmod attempts on the copied files, trees and the private placeholder all fail.
    await sandbox(gw, "a")
    attempts = [
        "echo x >> /etc/hosts",
        "touch /etc/ssl/planted",
        "mkdir /etc/ssl/certs/planted",
        "ln -s /workspace /etc/ssl/certs/planted.pem",
        "mv /etc/ssl/certs /etc/ssl/moved",
        "chmod 777 /etc/ssl/private",
        "ls /etc/ssl/private",
        "touch /etc/ssl/private/key.pem",
        "cat /etc/xdg/pip/pip.conf",  # a tool config inside an allowed tree: never copied
    ]
    for attempt in attempts:
        code, _, err = await sh(gw, attempt, "a")
        assert code != 0, (attempt, err)
    await sandbox(gw, "b")
    for path in ("/etc/ssl/planted", "/etc/ssl/certs/planted", "/etc/ssl/certs/planted.pem", "/etc/ssl/moved"):
        code, _, err = await sh(gw, f"ls -d {path}", "b")
        assert code != 0, path
        assert "No such file" in err, (path, err)
    assert (await sh(gw, "cat /etc/hosts", "b"))[1] == Path("/etc/hosts").read_text()
    await still_real(gw, "b")
