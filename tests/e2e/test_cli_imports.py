"""What a CLI call loads: `sandbox list`, `get`, `exec` and `pool list` against a real gateway go
through the SDK's HTTP/2 transport and never import grpc, asyncio or pydantic, whose imports
alone cost more than the CLI's latency budget (bench/cli_latency.py measures the time)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.helpers.cli import CliGateway, start_gateway, warmshell_env

# Runs the CLI in-process as the console script would, then reports what it imported.
_PROBE = """
import contextlib, io, json, sys
HEAVY = ("grpc", "asyncio", "pydantic", "rich")
from warmshell.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main.run(sys.argv[1:])
print(json.dumps({"code": code, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path_factory.mktemp("imports") / "state")
    try:
        created = running.run("sandbox", "create", "--name", "light")
        assert created.returncode == 0, created.stderr + running.log()
        yield running
    finally:
        assert running.stop() == 0, running.log()


def _probe(gateway: CliGateway, *argv: str, env: dict[str, str] | None = None) -> dict[str, object]:
    env = warmshell_env(gateway.state_dir) | (env or {})
    ran = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    result: dict[str, object] = json.loads(ran.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "argv",
    [
        ["sandbox", "list"],
        ["sandbox", "list", "-o", "json"],
        ["sandbox", "get", "light"],
        ["sandbox", "exec", "light", "--", "true"],
        ["sandbox", "exec", "light", "-o", "json", "--", "echo", "hi"],
        ["pool", "list"],
        ["sandbox", "get", "missing"],
    ],
)
def test_the_common_commands_import_nothing_heavy(gateway: CliGateway, argv: list[str]) -> None:
    result = _probe(gateway, *argv)
    assert result["code"] == (3 if "missing" in argv else 0)
    assert result["heavy"] == []


def test_the_grpcio_transport_is_the_fallback_and_behaves_the_same(gateway: CliGateway) -> None:
    light = _probe(gateway, "sandbox", "get", "missing")
    fallback = _probe(gateway, "sandbox", "get", "missing", env={"WARMSHELL_TRANSPORT": "grpcio"})
    assert fallback["code"] == light["code"] == 3
    assert "grpc" in fallback["heavy"]  # type: ignore[operator]
