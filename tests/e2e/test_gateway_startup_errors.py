"""Start-up failures a user can cause give one line (the cause and the fix) and a non-zero exit:
a busy HTTP port, a state directory another gateway serves, a bad or missing config file, a
state directory too long for its sockets. A traceback only with `--log-level debug`."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import CliGateway, start_gateway, warmshell_env, warmshell_executable

START_FAILURE_TIMEOUT_SECONDS = 60.0


def _start(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [warmshell_executable(), "gateway", "start", "--state-dir", str(state_dir), *args],
        env=warmshell_env(state_dir),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_FAILURE_TIMEOUT_SECONDS,
        check=False,
    )


def _one_line_error(ran: subprocess.CompletedProcess[str]) -> str:
    assert ran.returncode not in (0, None), ran
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("error: "), ran.stderr
    assert ran.stdout == ""
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield int(holder.getsockname()[1])
    finally:
        holder.close()


def test_busy_http_port_names_the_port_and_the_flag(tmp_path: Path, busy_port: int) -> None:
    line = _one_line_error(_start(tmp_path / "state", "--http-port", str(busy_port)))
    assert f"127.0.0.1:{busy_port}" in line
    assert "already in use" in line
    assert "--http-port 0" in line
    assert not (tmp_path / "state" / "gateway.sock").exists()


def test_busy_http_port_from_the_environment_is_reported_the_same(tmp_path: Path, busy_port: int) -> None:
    state = tmp_path / "state"
    ran = subprocess.run(
        [warmshell_executable(), "gateway", "start", "--state-dir", str(state)],
        env={**warmshell_env(state), "WARMSHELL_HTTP_PORT": str(busy_port)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_FAILURE_TIMEOUT_SECONDS,
        check=False,
    )
    assert f":{busy_port} is already in use" in _one_line_error(ran)


def test_debug_log_level_adds_the_traceback(tmp_path: Path, busy_port: int) -> None:
    ran = _start(tmp_path / "state", "--http-port", str(busy_port), "--log-level", "debug")
    assert ran.returncode != 0
    assert "Traceback (most recent call last)" in ran.stderr
    assert ran.stderr.rstrip().splitlines()[-1].startswith("error: HTTP port")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[CliGateway]:
    gateway = start_gateway(tmp_path / "state")
    try:
        yield gateway
    finally:
        assert gateway.stop() == 0, gateway.log()


def test_second_gateway_on_the_same_state_dir_is_refused_quietly(running: CliGateway) -> None:
    line = _one_line_error(_start(running.state_dir, "--http-port", "0"))
    assert str(running.state_dir / "gateway.sock") in line
    assert "--state-dir" in line
    # The first gateway still serves: the refused one removed nothing.
    assert running.run("sandbox", "list").returncode == 0


def test_bad_toml_names_the_file_and_the_position(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("http_port = 0\nlocal = = 3\n")
    line = _one_line_error(_start(tmp_path / "state", "--config", str(config)))
    assert str(config) in line
    assert "not valid TOML" in line
    assert "line" in line
    assert _start(tmp_path / "state", "--config", str(config)).returncode == 5


def test_missing_config_file_says_so(tmp_path: Path) -> None:
    config = tmp_path / "nowhere.toml"
    line = _one_line_error(_start(tmp_path / "state", "--config", str(config)))
    assert f"{config}: cannot read the config file: No such file or directory" in line


def test_bad_config_value_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("http_prot = 0\n")
    line = _one_line_error(_start(tmp_path / "state", "--config", str(config)))
    assert "http_prot" in line


def test_state_dir_too_long_for_a_socket(tmp_path: Path) -> None:
    state = tmp_path / ("x" * 120)
    line = _one_line_error(_start(state, "--http-port", "0"))
    assert "more than the 107 a Unix socket allows" in line
    assert "--state-dir" in line
