"""What scripts see when things go wrong: exit codes and `error: <message>` naming the field."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import CliGateway, start_gateway, warmshell_env, warmshell_executable


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    # One gateway for the module: these tests only read or fail, so they cannot disturb each
    # other (names are distinct), and starting a gateway per case would dominate the run time.
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path_factory.mktemp("errors") / "state")
    try:
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--name", "Not_A_Label"], "name"),
        (["--env", "1X=y"], "environment"),
        (["--cpu", "lots"], "cpu"),
        (["--memory", "12 parsecs"], "memory"),
        (["--workspace", "Upper/Case"], "workspace"),
        (["--label", "warmshell.dev/x=y"], "labels"),
    ],
)
def test_bad_input_exits_5_naming_the_field_and_creates_nothing(
    gateway: CliGateway, flags: list[str], field: str
) -> None:
    before = _all_sandboxes(gateway)
    ran = gateway.run("sandbox", "create", *flags)
    assert ran.returncode == 5, ran.stderr
    assert ran.stderr.startswith("error: ")
    assert field in ran.stderr.splitlines()[0]
    assert _all_sandboxes(gateway) == before


def _all_sandboxes(gateway: CliGateway) -> list[str]:
    listed = gateway.run("sandbox", "list", "--all-workspaces", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    return sorted(f"{s['workspace']}/{s['name']}" for s in json.loads(listed.stdout)["sandboxes"])


def test_malformed_flag_is_a_usage_error(gateway: CliGateway) -> None:
    ran = gateway.run("sandbox", "create", "--env", "NO_EQUALS_SIGN")
    assert ran.returncode == 2
    assert "--env" in ran.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["sandbox", "get", "missing"],
        ["sandbox", "delete", "missing"],
        ["sandbox", "exec", "missing", "--", "true"],
        ["sandbox", "watch", "missing"],
    ],
)
def test_unknown_sandbox_exits_3(gateway: CliGateway, command: list[str]) -> None:
    ran = gateway.run(*command)
    assert ran.returncode == 3, ran.stderr
    assert ran.stderr.startswith("error: ")
    assert "missing" in ran.stderr


def test_duplicate_name_exits_4(gateway: CliGateway) -> None:
    assert gateway.run("sandbox", "create", "--name", "twice", "--detach").returncode == 0
    again = gateway.run("sandbox", "create", "--name", "twice", "--detach")
    assert again.returncode == 4, again.stderr
    assert "twice" in again.stderr


def test_wrong_token_exits_77(gateway: CliGateway) -> None:
    ran = gateway.run("--token", "not-the-token", "sandbox", "list")
    assert ran.returncode == 77, ran.stderr
    assert ran.stderr.startswith("error: ")


def test_no_gateway_exits_69_and_suggests_starting_one(tmp_path: Path) -> None:
    import subprocess

    ran = subprocess.run(
        [warmshell_executable(), "sandbox", "list"],
        env=warmshell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 69
    assert f"error: no gateway socket at {tmp_path}/gateway.sock" in ran.stderr
    assert "warmshell gateway start" in ran.stderr


def test_a_second_gateway_on_the_same_state_dir_refuses_to_start(gateway: CliGateway) -> None:
    import subprocess

    second = subprocess.run(
        [warmshell_executable(), "gateway", "start", "--state-dir", str(gateway.state_dir), "--http-port", "0"],
        env=warmshell_env(gateway.state_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 6, second.stderr  # failed precondition
    assert "error: " in second.stderr
    assert "already serving" in second.stderr


def test_exec_in_a_sandbox_that_is_not_ready_exits_6(gateway: CliGateway) -> None:
    finished = gateway.run("sandbox", "create", "--name", "done", "--", "true")
    assert finished.returncode == 0, finished.stderr
    ran = gateway.run("sandbox", "exec", "done", "--", "true")
    assert ran.returncode == 6, ran.stderr
    assert ran.stderr.startswith("error: ")


def test_an_oversized_request_exits_9(gateway: CliGateway) -> None:
    # Twelve 100 kB variables: each within the kernel's per-argument limit, together over the
    # gateway's 1 MiB request limit.
    flags = [arg for i in range(12) for arg in ("--env", f"V{i}={'a' * 100_000}")]
    ran = gateway.run("sandbox", "create", *flags)
    assert ran.returncode == 9, ran.stderr  # resource exhausted: over a limit
    assert ran.stderr.startswith("error: ")


def test_the_console_script_runs_the_supervisor_as_pods_do(tmp_path: Path) -> None:
    # Pods run `warmshell supervisor` through the image's ENTRYPOINT, the console script.
    env = warmshell_env(tmp_path)
    ran = subprocess.run(
        [warmshell_executable(), "supervisor"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode != 0
    assert "supervisor ERROR cannot start: WARMSHELL_GATEWAY is not set" in ran.stderr
