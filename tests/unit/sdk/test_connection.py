"""Finding the gateway and the token as the CLI does: explicit values, then WARMSHELL_*, then
the state directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.sdk import connection


def test_explicit_values_win(tmp_path: Path) -> None:
    target = connection.resolve(
        address="/run/gw.sock", token="t0", state_dir=tmp_path, workspace="team", environ={"WARMSHELL_GATEWAY": "x:1"}
    )
    assert target == connection.Target("unix:///run/gw.sock", "t0", "team")


def test_environment_then_state_directory(tmp_path: Path) -> None:
    (tmp_path / "api-token").write_text("from-file\n")
    env = {"WARMSHELL_GATEWAY": "127.0.0.1:7443", "WARMSHELL_API_TOKEN": "from-env", "WARMSHELL_WORKSPACE": "w"}
    assert connection.resolve(state_dir=tmp_path, environ=env) == connection.Target("127.0.0.1:7443", "from-env", "w")
    plain = connection.resolve(environ={"WARMSHELL_STATE_DIR": str(tmp_path)}, state_dir=tmp_path)
    assert plain == connection.Target(f"unix://{tmp_path}/gateway.sock", "from-file", "")


def test_state_dir_from_the_environment_and_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMSHELL_STATE_DIR", str(tmp_path))
    target = connection.resolve(environ={})
    assert (target.address, target.token) == (f"unix://{tmp_path}/gateway.sock", None)
    assert connection.unix_socket_path("unix:rel.sock") == Path("rel.sock")
    assert connection.unix_socket_path("host:1") is None
