"""The real `warmshell` command against a real gateway process with real bwrap'd supervisors:
the lifecycle a user walks through, output streaming and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import CliGateway, start_gateway


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[CliGateway]:
    # No skip without bubblewrap: CI installs it, and a silent skip would hide a broken setup.
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path / "state")
    try:
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


def _normalised_lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


NPROC = "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])"


def test_create_exec_get_list_delete(gateway: CliGateway) -> None:
    created = gateway.run("sandbox", "create", "--name", "box", "--env", "GREETING=hi", "-o", "json")
    assert created.returncode == 0, created.stderr + gateway.log()
    sandbox = json.loads(created.stdout)
    assert sandbox["name"] == "box"
    assert sandbox["status"]["phase"] == "SANDBOX_PHASE_READY"
    assert sandbox["status"]["allocation"] == "cold"

    ran = gateway.run("sandbox", "exec", "box", "--", "sh", "-c", 'echo "$GREETING out"; echo err >&2; exit 3')
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, "hi out\n", "err\n")

    got = gateway.run("sandbox", "get", "box")
    assert got.returncode == 0, got.stderr
    lines = _normalised_lines(got.stdout)
    assert "Phase Ready" in lines
    assert "Allocation cold" in lines
    for step in ("backend created", "registered", "activated", "ready"):
        assert any(line.startswith(f"{step} +") and line.endswith(" ms") for line in lines), (
            step,
            got.stdout,
        )

    listed = gateway.run("sandbox", "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0][:3] == ["NAME", "WORKSPACE", "PHASE"]
    assert ["box", "default", "Ready", "cold"] in [row[:4] for row in rows[1:]]

    deleted = gateway.run("sandbox", "delete", "box")
    assert (deleted.returncode, deleted.stdout) == (0, "sandbox box deleted\n"), deleted.stderr
    gone = gateway.run("sandbox", "get", "box")
    assert gone.returncode == 3
    assert gone.stderr.startswith("error: ")


def test_create_human_prints_a_ready_summary(gateway: CliGateway) -> None:
    created = gateway.run("sandbox", "create", "--name", "human")
    assert created.returncode == 0, created.stderr + gateway.log()
    assert created.stdout.startswith("sandbox human (workspace default) is Ready: cold, ")
    assert created.stdout.endswith(" ms to Ready\n")


def test_create_with_a_command_streams_output_and_exits_with_its_code(gateway: CliGateway) -> None:
    script = "echo first; echo oops >&2; echo second; exit 9"
    ran = gateway.run("sandbox", "create", "--name", "job", "--", "sh", "-c", script)
    assert ran.returncode == 9, ran.stderr + gateway.log()
    assert ran.stdout == "first\nsecond\n"
    assert ran.stderr == "oops\n"

    got = gateway.run("sandbox", "get", "job", "-o", "json")
    status = json.loads(got.stdout)["status"]
    assert status["phase"] == "SANDBOX_PHASE_EXITED"  # a workload exit is terminal, never Ready or Error
    assert status["exit_code"] == 9


def test_create_with_pids_bounds_the_sandbox_and_get_shows_it(gateway: CliGateway) -> None:
    created = gateway.run("sandbox", "create", "--name", "few", "--pids", "32", "-o", "json")
    assert created.returncode == 0, created.stderr + gateway.log()
    assert json.loads(created.stdout)["spec"]["resources"]["pids"] == 32
    got = gateway.run("sandbox", "get", "few")
    assert "Resources cpu -, memory -, pids 32" in _normalised_lines(got.stdout), got.stdout
    if os.geteuid() == 0:  # a uid per sandbox: RLIMIT_NPROC is the bound, visible inside
        ran = gateway.run("sandbox", "exec", "few", "--", "python3", "-c", NPROC)
        assert (ran.returncode, ran.stdout) == (0, "32\n"), ran.stderr
    refused = gateway.run("sandbox", "create", "--pids", "5")
    assert refused.returncode == 5, refused.stderr  # the gateway's rule: INVALID_ARGUMENT
    assert "spec.resources.pids" in refused.stderr
    not_a_number = gateway.run("sandbox", "create", "--pids", "many")
    assert not_a_number.returncode == 2
    assert "--pids: 'many' is not a whole number" in not_a_number.stderr


def test_create_with_a_succeeding_command_exits_zero(gateway: CliGateway) -> None:
    ran = gateway.run("sandbox", "create", "--", "true")
    assert (ran.returncode, ran.stdout) == (0, ""), ran.stderr + gateway.log()


def test_watch_follows_a_sandbox_until_it_is_deleted(gateway: CliGateway) -> None:
    created = gateway.run("sandbox", "create", "--name", "watched")
    assert created.returncode == 0, created.stderr
    watcher = gateway.popen("sandbox", "watch", "watched")
    try:
        assert watcher.stdout is not None
        first = watcher.stdout.readline()  # blocks until the watch is established
        assert first.split()[1:] == ["phase", "Ready"]
        assert gateway.run("sandbox", "delete", "watched").returncode == 0
        rest, errors = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, errors
    # The watch ends by itself once the sandbox is on its way out (Deleting) or gone.
    last = " ".join(rest.splitlines()[-1].split()[1:])
    assert last in ("phase Deleting", "watched deleted"), rest


def test_pool_list_without_pools(gateway: CliGateway) -> None:
    listed = gateway.run("pool", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["pools"] == []


def test_ctrl_c_ends_a_watch_with_130(gateway: CliGateway) -> None:
    created = gateway.run("sandbox", "create", "--name", "interrupted")
    assert created.returncode == 0, created.stderr
    watcher = gateway.popen("sandbox", "watch", "interrupted")
    try:
        assert watcher.stdout is not None
        assert "phase Ready" in watcher.stdout.readline()
        watcher.send_signal(signal.SIGINT)
        _, errors = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 130
    assert "Traceback" not in errors


def test_exec_stdin_and_timeout(gateway: CliGateway) -> None:
    assert gateway.run("sandbox", "create", "--name", "io").returncode == 0
    echoed = gateway.run("sandbox", "exec", "io", "--stdin", "--", "cat", stdin=b"piped\n")
    assert (echoed.returncode, echoed.stdout) == (0, "piped\n"), echoed.stderr
    slow = gateway.run("sandbox", "exec", "io", "--timeout", "1", "--", "sleep", "30")
    assert (slow.returncode, slow.stderr) == (124, "warmshell: timed out after 1s\n")  # the CLI's own line
    missing = gateway.run("sandbox", "exec", "io", "--", "no-such-program")
    assert (missing.returncode, missing.stderr) == (127, "warmshell: no-such-program: command not found\n")
    as_json = gateway.run("sandbox", "exec", "io", "-o", "json", "--timeout", "1", "--", "sleep", "30")
    document = json.loads(as_json.stdout)
    assert (as_json.returncode, document["timed_out"], document["signal"], document["stderr"]) == (124, True, 9, "")


def test_ctrl_c_while_streaming_a_workload_exits_130_and_names_the_sandbox(gateway: CliGateway) -> None:
    creator = gateway.popen("sandbox", "create", "--name", "long", "--", "sh", "-c", "echo started; sleep 60")
    try:
        assert creator.stdout is not None
        assert creator.stdout.readline() == "started\n"
        creator.send_signal(signal.SIGINT)
        _, errors = creator.communicate(timeout=30)
    finally:
        if creator.poll() is None:
            creator.kill()
            creator.communicate()
    assert creator.returncode == 130
    assert "sandbox long was left in place" in errors
    assert "Traceback" not in errors
    assert gateway.run("sandbox", "get", "long").returncode == 0
