"""Local flag handling: K=V parsing, connection options and their precedence, the exit-code map."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import typer
from typer.testing import CliRunner

from warmshell.cli import client
from warmshell.cli.errors import ExitCode
from warmshell.cli.main import app
from warmshell.cli.options import GlobalOptions, parse_pairs


def test_parse_pairs_splits_on_the_first_equals() -> None:
    assert parse_pairs(["A=1", "B=x=y", "C="], flag="--env") == {"A": "1", "B": "x=y", "C": ""}


@pytest.mark.parametrize(
    ("values", "problem"),
    [(["A"], "not of the form KEY=VALUE"), (["=1"], "not of the form"), (["A=1", "A=2"], "more than once")],
)
def test_parse_pairs_rejects_malformed_values_naming_the_flag(values: list[str], problem: str) -> None:
    with pytest.raises(typer.BadParameter, match=problem) as info:
        parse_pairs(values, flag="--label")
    assert info.value.param_hint == "--label"


def test_every_grpc_status_has_an_exit_code() -> None:
    assert set(client.STATUS_EXIT_CODES) == set(grpc.StatusCode)


def test_exit_codes_are_distinct() -> None:
    assert len({int(code) for code in ExitCode}) == len(ExitCode)


def test_address_defaults_to_the_state_dir_socket(tmp_path: Path) -> None:
    options = GlobalOptions(state_dir=tmp_path)
    assert client.resolve_address(options) == f"unix://{tmp_path}/gateway.sock"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("unix:///run/ws.sock", "unix:///run/ws.sock"),
        ("/run/ws.sock", "unix:///run/ws.sock"),
        ("localhost:7443", "localhost:7443"),
    ],
)
def test_address_from_gateway_flag(given: str, expected: str) -> None:
    assert client.resolve_address(GlobalOptions(gateway=given)) == expected


def test_token_comes_from_the_flag_then_the_state_dir(tmp_path: Path) -> None:
    assert client.resolve_token(GlobalOptions(state_dir=tmp_path)) is None
    (tmp_path / "api-token").write_text("from-file\n")
    assert client.resolve_token(GlobalOptions(state_dir=tmp_path)) == "from-file"
    assert client.resolve_token(GlobalOptions(state_dir=tmp_path, token="flag")) == "flag"


def test_help_documents_the_exit_codes() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for fragment in (
        "3 not found",
        "4 already exists",
        "5 invalid argument",
        "69 gateway unreachable",
        "77 unauthenticated",
    ):
        assert fragment in text


def test_gateway_start_rejects_a_bad_config_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('driver = "nope"\n')
    result = CliRunner().invoke(app, ["gateway", "start", "--state-dir", str(tmp_path), "--config", str(config)])
    assert result.exit_code == ExitCode.INVALID_ARGUMENT
    assert result.stderr.startswith("error: ")
    assert "driver" in result.stderr
