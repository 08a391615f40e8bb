"""Local flag handling: K=V parsing, connection options and their precedence, the exit-code map."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from warmshell.cli import client, main
from warmshell.cli.errors import CliError, ExitCode
from warmshell.cli.options import GlobalOptions, parse_pairs, parse_secrets
from warmshell.core import profiles
from warmshell.core.apiranges import MAX_LIFETIME_SECONDS
from warmshell.sdk import http2


def test_parse_pairs_splits_on_the_first_equals() -> None:
    assert parse_pairs(["A=1", "B=x=y", "C="], flag="--env") == {"A": "1", "B": "x=y", "C": ""}


@pytest.mark.parametrize(
    ("values", "problem"),
    [(["A"], "not of the form KEY=VALUE"), (["=1"], "not of the form"), (["A=1", "A=2"], "more than once")],
)
def test_parse_pairs_rejects_malformed_values_naming_the_flag(values: list[str], problem: str) -> None:
    with pytest.raises(CliError, match=problem) as info:
        parse_pairs(values, flag="--label")
    assert info.value.message.startswith("--label: ")
    assert info.value.code == ExitCode.USAGE


def test_every_grpc_status_has_an_exit_code() -> None:
    assert set(client.STATUS_EXIT_CODES) == {code.name for code in grpc.StatusCode} == set(http2.STATUS_NAMES)
    # The HTTP/2 client numbers them as the protocol does.
    assert [http2.STATUS_NAMES.index(code.name) for code in grpc.StatusCode] == [c.value[0] for c in grpc.StatusCode]


def test_exit_codes_are_distinct() -> None:
    assert len({int(code) for code in ExitCode}) == len(ExitCode)


def test_address_defaults_to_the_state_dir_socket(tmp_path: Path) -> None:
    with client.connect(GlobalOptions(state_dir=tmp_path)) as sdk:
        assert sdk.address == f"unix://{tmp_path}/gateway.sock"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("unix:///run/ws.sock", "unix:///run/ws.sock"),
        ("/run/ws.sock", "unix:///run/ws.sock"),
        ("localhost:7443", "localhost:7443"),
    ],
)
def test_address_from_gateway_flag(given: str, expected: str) -> None:
    with client.connect(GlobalOptions(gateway=given)) as sdk:
        assert sdk.address == expected


def _bearer(options: GlobalOptions) -> str | None:
    with client.connect(options) as sdk:
        metadata = dict(sdk.service.metadata)
    return metadata.get("authorization")


def test_token_comes_from_the_flag_then_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMSHELL_API_TOKEN", raising=False)
    assert _bearer(GlobalOptions(state_dir=tmp_path)) is None
    (tmp_path / "api-token").write_text("from-file\n")
    assert _bearer(GlobalOptions(state_dir=tmp_path)) == "Bearer from-file"
    assert _bearer(GlobalOptions(state_dir=tmp_path, token="flag")) == "Bearer flag"


def test_an_unreadable_token_file_is_unauthenticated_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WARMSHELL_API_TOKEN", raising=False)
    (tmp_path / "api-token").mkdir()  # reading a directory fails with EISDIR, even as root
    code = main.run(["--state-dir", str(tmp_path), "sandbox", "list"])
    assert code == ExitCode.UNAUTHENTICATED
    assert f"error: cannot read the API token at {tmp_path}/api-token: Is a directory" in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main.run(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in (
        "3 not found",
        "4 already exists",
        "5 invalid argument",
        "69 gateway unreachable",
        "8 permission denied",
        "9 resource exhausted",
        "77 unauthenticated",
    ):
        assert fragment in text


def test_gateway_start_rejects_a_bad_config_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('driver = "nope"\n')
    code = main.run(["gateway", "start", "--state-dir", str(tmp_path), "--config", str(config)])
    assert code == ExitCode.INVALID_ARGUMENT
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ")
    assert "driver" in stderr


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main.run(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == "warmshell 0.1.0\n"


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main.run([*argv, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [
        [],
        *(["gateway", name] for name in ("start", "wait")),
        *(["sandbox", name] for name in ("create", "list", "get", "exec", "delete", "watch")),
        ["pool", "list"],
    ],
)
def test_help_never_shows_a_boolean_metavar(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(command, capsys)
    assert "<bool>" not in text
    assert "BOOL" not in text.upper().replace("BOOLEAN", "")


def test_boolean_flags_are_plain_flags(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["sandbox", "create"], capsys)
    assert "-d, --detach  " in text
    assert "--all-workspaces  " in _help(["sandbox", "list"], capsys)


def test_pool_list_workspace_help_is_about_pools(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help(["pool", "list"], capsys).split())
    assert "workspace of the pools to list" in text
    assert "of the sandbox" not in text


@pytest.mark.parametrize(
    "argv",
    [
        ["sandbox", "create", "--detach", "true"],
        ["sandbox", "create", "-d", "false"],
        ["sandbox", "list", "-A", "yes"],
        ["sandbox", "exec", "box", "--stdin", "true", "--", "cat"],
    ],
)
def test_a_word_after_a_boolean_flag_is_refused_not_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["--gateway", "unix:///nonexistent.sock", *argv]) == ExitCode.USAGE
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ")
    assert "unrecognized arguments" in stderr
    assert "take no value" in stderr
    assert "after `--`" in stderr


def test_exec_needs_the_command_after_the_separator(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["--gateway", "unix:///nonexistent.sock", "sandbox", "exec", "box"]) == ExitCode.USAGE
    assert "after `--`" in capsys.readouterr().err


def test_a_command_given_to_a_command_that_runs_none_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["--gateway", "unix:///nonexistent.sock", "sandbox", "get", "box", "--", "ls"]) == ExitCode.USAGE
    assert "sandbox get takes no command" in capsys.readouterr().err


def test_a_missing_subcommand_prints_help_and_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["sandbox"]) == ExitCode.USAGE
    assert "create" in capsys.readouterr().out


def test_secrets_come_from_flags_and_files(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("from-a-file\n")
    assert parse_secrets(["A=x=y"], [f"B={tmp_path / 'key'}"]) == {"A": "x=y", "B": "from-a-file"}


@pytest.mark.parametrize(
    ("values", "files", "problem"),
    [
        (["hunter2"], [], "--secret: an argument is not of the form KEY=VALUE (value not shown)"),
        (["A=1"], ["A=/dev/null"], "--secret-file: 'A' is given more than once"),
        ([], ["A=/nonexistent/secret"], "--secret-file: A: cannot read /nonexistent/secret"),
    ],
)
def test_bad_secret_flags_never_echo_a_value(values: list[str], files: list[str], problem: str) -> None:
    with pytest.raises(CliError) as info:
        parse_secrets(values, files)
    assert info.value.message.startswith(problem)
    assert "hunter2" not in info.value.message
    assert info.value.code == ExitCode.USAGE


@pytest.mark.parametrize("flag", ["--ttl", "--idle-timeout"])
def test_a_lifetime_beyond_the_apis_uint32_is_refused_before_sending(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    beyond = str(MAX_LIFETIME_SECONDS + 1)
    assert main.run(["--gateway", "unix:///nonexistent.sock", "sandbox", "create", flag, beyond]) == ExitCode.USAGE
    assert f"{beyond} is not in 0..{MAX_LIFETIME_SECONDS}" in capsys.readouterr().err
    # The largest the API carries passes the flag check and fails only at the (absent) gateway.
    at_most = ["--gateway", "unix:///nonexistent.sock", "sandbox", "create", flag, str(MAX_LIFETIME_SECONDS)]
    assert main.run(at_most) == ExitCode.UNAVAILABLE


def test_the_api_ranges_module_imports_nothing() -> None:
    # The CLI imports it on every call; a domain import here would put pydantic on that path.
    probe = "import sys, warmshell.core.apiranges; print(sorted(m for m in sys.modules if 'core' in m or 'pyd' in m))"
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert ran.stdout.strip() == str(["warmshell.core", "warmshell.core.apiranges"])
    assert MAX_LIFETIME_SECONDS == 2**32 - 1 == profiles.MAX_LIFETIME_SECONDS
