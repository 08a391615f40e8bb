"""Background commands through a real gateway process (local driver, bwrap'd sandboxes): started
by a client that then dies, listed and reattached by another (sync on both transports, and
async), their output kept in a bounded ring (the oldest dropped, and said so), stdin and signals
from whoever attaches, and an unknown pid refused naming the field."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import warmshell
from tests.helpers.cli import CliGateway, configured_gateway
from warmshell.cli.client import STATUS_EXIT_CODES
from warmshell.sdk.interactive import Process

HISTORY = 64 * 1024
CONFIG = f"exec_history_bytes = {HISTORY}\n"
# A client in another process starts a command in the background, prints its pid and dies
# without closing anything (as a crashed harness would).
STARTER = """
import os, sys, warmshell
client = warmshell.Client(state_dir=sys.argv[1])
process = client.get(sys.argv[2]).start(
    ["sh", "-c", "echo one; read line; echo got $line; echo oops >&2; exit 3"], background=True, open_stdin=True
)
print(process.pid, flush=True)
os._exit(0)
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    with configured_gateway(tmp_path_factory.mktemp("background"), CONFIG) as running:
        yield running


@pytest.fixture
def sandbox(client: warmshell.Client) -> Iterator[warmshell.Sandbox]:
    with client.create() as sb:
        yield sb


def wait_exited(sandbox: warmshell.Sandbox, pid: int, timeout: float = 30.0) -> warmshell.ProcessInfo:
    """Poll the sandbox's processes until `pid` has exited (no client attached meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        info = {p.pid: p for p in sandbox.processes()}[pid]
        if not info.running:
            return info
        assert time.monotonic() < deadline, f"{pid} still runs: {info}"
        time.sleep(0.05)


def drain(process: Process) -> tuple[bytes, bytes, list[int]]:
    """Everything a reattached process still sends: stdout, stderr, each event's dropped count."""
    out, err, dropped = b"", b"", []
    for event in process:
        out, err = out + event.stdout, err + event.stderr
        dropped.append(event.dropped_bytes)
    return out, err, dropped


def test_a_command_outlives_the_client_that_started_it(gateway: CliGateway, sandbox: warmshell.Sandbox) -> None:
    starter = subprocess.run(
        [sys.executable, "-c", STARTER, str(gateway.state_dir), sandbox.name],
        capture_output=True,
        check=True,
        timeout=60,
    )
    pid = int(starter.stdout)
    [listed] = sandbox.processes()
    assert (listed.pid, listed.command, listed.state, listed.exit_code) == (
        pid,
        ("sh", "-c", listed.command[2]),
        "running",
        None,
    )
    with sandbox.connect(pid) as process:
        first = process.recv(timeout=20)
        assert first is not None
        assert first.stdout == b"one\n"  # written before this client existed
        process.send("hello\n")
        out, err, _ = drain(process)
    assert (out, err, process.exit_code) == (b"got hello\n", b"oops\n", 3)
    [ended] = sandbox.processes()
    assert (ended.state, ended.exit_code, ended.output_bytes, ended.dropped_bytes) == ("exited", 3, 19, 0)
    assert ended.ended_at is not None
    assert ended.ended_at >= ended.started_at
    # After its exit its output is still there, for a client that comes late.
    with sandbox.connect(pid) as late:
        assert drain(late)[:2] == (b"one\ngot hello\n", b"oops\n")
    assert late.exit_code == 3


def test_detaching_stops_nothing_and_stdin_is_closed_unless_asked(sandbox: warmshell.Sandbox) -> None:
    reader = sandbox.start(["cat"], background=True)
    assert reader.wait() == 0  # its stdin was closed at once: cat ends
    with sandbox.start(["sh", "-c", "sleep 1; echo done"], background=True) as process:
        assert process.pid is not None
    info = wait_exited(sandbox, process.pid)
    assert (info.exit_code, info.output_bytes) == (0, 5)


def test_the_ring_keeps_the_last_bytes_and_says_how_many_were_dropped(sandbox: warmshell.Sandbox) -> None:
    total = 3 * HISTORY + 1000
    script = f"head -c {total - 4} /dev/zero | tr '\\0' x; echo END"
    started = sandbox.start(["sh", "-c", script], background=True)
    started.close()  # nobody reads while it writes more than the ring holds
    info = wait_exited(sandbox, started.pid or 0)
    assert (info.output_bytes, info.dropped_bytes) == (total, total - HISTORY)
    with sandbox.connect(info.pid) as process:
        out, _, dropped = drain(process)
    assert len(out) == HISTORY
    assert out.endswith(b"xxxEND\n")
    assert dropped[0] == total - HISTORY
    assert not any(dropped[1:])


def test_an_unknown_pid_is_not_found_naming_the_field(sandbox: warmshell.Sandbox) -> None:
    with sandbox.connect(4242) as process, pytest.raises(warmshell.NotFound, match=r"pid: .*4242"):
        process.wait()


def test_a_signal_from_a_reattached_client_ends_it(sandbox: warmshell.Sandbox) -> None:
    pid = sandbox.start(["sleep", "60"], background=True).pid or 0
    with sandbox.connect(pid) as process:
        process.kill()
        assert process.wait() == 128 + signal.SIGKILL
    assert process.outcome is not None
    assert process.outcome.signal == signal.SIGKILL


async def test_async_start_detach_and_reattach(gateway: CliGateway) -> None:
    async with warmshell.AsyncClient(state_dir=gateway.state_dir) as first:
        sb = await first.create()
        try:
            process = await sb.start(["sh", "-c", "echo ready; sleep 60"], background=True)
            assert (await process.recv()) == warmshell.OutputEvent(stdout=b"ready\n")
            pid = process.pid
            assert pid is not None
        finally:
            await first.close()  # the client goes away; the command does not
        async with warmshell.AsyncClient(state_dir=gateway.state_dir) as second:
            again = await second.get(sb.name)
            [info] = await again.processes()
            assert (info.pid, info.running) == (pid, True)
            async with await again.connect(pid) as attached:
                assert (await attached.recv()) == warmshell.OutputEvent(stdout=b"ready\n")
                await attached.signal(signal.SIGTERM)
                assert await asyncio.wait_for(attached.wait(), 30) == 128 + signal.SIGTERM
            await again.delete()


def test_the_cli_starts_lists_and_attaches(gateway: CliGateway, sandbox: warmshell.Sandbox) -> None:
    started = gateway.run("sandbox", "exec", "-b", sandbox.name, "--", "sh", "-c", "echo hi; echo err >&2; exit 4")
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout)
    wait_exited(sandbox, pid)
    listed = gateway.run("sandbox", "ps", sandbox.name)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["PID", "STATE", "EXIT", "AGE", "OUTPUT", "COMMAND"]
    assert row.split()[:3] == [str(pid), "exited", "4"]
    assert row.endswith("sh -c echo hi; echo err >&2; exit 4")
    as_json = gateway.run("sandbox", "ps", sandbox.name, "-o", "json")
    [entry] = json.loads(as_json.stdout)["processes"]
    assert (entry["pid"], entry["exit_code"], entry["output_bytes"]) == (pid, 4, 7)
    attached = gateway.run("sandbox", "attach", sandbox.name, str(pid))
    assert (attached.returncode, attached.stdout, attached.stderr) == (4, "hi\n", "err\n")
    unknown = gateway.run("sandbox", "attach", sandbox.name, "4242")
    assert unknown.returncode == STATUS_EXIT_CODES["NOT_FOUND"]
    assert "pid: the sandbox has no background command 4242" in unknown.stderr
