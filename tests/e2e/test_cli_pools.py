"""`warmshell pool list` and the warm/cold display of `sandbox get`, against a real gateway that
keeps a local warm pool from a profile directory (`gateway start --pools DIR`)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import CliGateway, start_gateway

PROFILE = """\
version = 1
workspace = "default"
replicas = 2
image = ""

[environment]
FOO = "bar"
"""

POOL_FILL_TIMEOUT_SECONDS = 15.0


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[CliGateway]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "env.toml").write_text(PROFILE)
    running = start_gateway(tmp_path / "state", "--pools", str(pools))
    try:
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


def _pools(gateway: CliGateway) -> dict[str, Any]:
    listed = gateway.run("pool", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert isinstance(document, dict)
    return document


def _wait_until_filled(gateway: CliGateway) -> None:
    # Each `pool list` is a full CLI round trip, so this loop re-checks the condition without
    # sleeping; the deadline only bounds a pool that never fills.
    deadline = time.monotonic() + POOL_FILL_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        pools = _pools(gateway)["pools"]
        if pools and all(pool["ready"] == pool["desired"] for pool in pools):
            return
    raise AssertionError(f"pool did not fill in {POOL_FILL_TIMEOUT_SECONDS}s:\n{gateway.log()}")


def test_a_matching_create_is_served_warm_and_counted(gateway: CliGateway) -> None:
    _wait_until_filled(gateway)

    warm = gateway.run("sandbox", "create", "--name", "warm", "--env", "FOO=bar")
    assert warm.returncode == 0, warm.stderr
    assert "is Ready: warm (pool " in warm.stdout
    cold = gateway.run("sandbox", "create", "--name", "cold", "--env", "FOO=other")
    assert cold.returncode == 0, cold.stderr
    assert "is Ready: cold," in cold.stdout

    got = gateway.run("sandbox", "get", "warm")
    lines = [" ".join(line.split()) for line in got.stdout.splitlines()]
    assert any(line.startswith("Allocation warm (pool ") for line in lines), got.stdout
    assert any(line.startswith("claimed +") for line in lines), got.stdout

    listed = gateway.run("pool", "list")
    assert listed.returncode == 0, listed.stderr
    header, row, *rest = listed.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "WORKSPACE", "FINGERPRINT"]
    cells = row.split()
    assert cells[1] == "default"
    assert len(cells[2]) == 12
    assert cells[4:7] == ["1", "0", "100.0%"]  # one hit; the miss matched no pool at all
    assert "NoMatch 1" in rest[-1]


def test_pool_list_shows_invalid_and_shape_sharing_profiles(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "env.toml").write_text(PROFILE)
    (pools / "twin.toml").write_text(PROFILE.replace("replicas = 2", "replicas = 1"))  # same shape
    (pools / "typo.toml").write_text('version = 1\nworkspace = "default"\nreplicsa = 2\n')
    running = start_gateway(tmp_path / "state", "--pools", str(pools))
    try:
        deadline = time.monotonic() + POOL_FILL_TIMEOUT_SECONDS
        while {p["name"] for p in _pools(running)["pools"]} != {"env", "twin", "typo"}:
            assert time.monotonic() < deadline, running.log()
        by_name = {p["name"]: p for p in _pools(running)["pools"]}
        typo = by_name["typo"]["conditions"]
        assert [(c["type"], c["status"], c["reason"]) for c in typo] == [("ProfileValid", "False", "InvalidProfile")]
        assert typo[0]["message"] == f"{pools / 'typo.toml'}:3: replicsa: " + typo[0]["message"].split(": ", 2)[2]
        assert "unknown key" in typo[0]["message"]
        for name, other in (("env", "twin"), ("twin", "env")):
            [shared] = by_name[name]["conditions"]
            assert (shared["type"], shared["reason"]) == ("Unambiguous", "SharedShape")
            assert f"as {other}:" in shared["message"]

        human = running.run("pool", "list")
        assert human.returncode == 0, human.stderr
        assert f"typo: InvalidProfile: {pools / 'typo.toml'}:3: replicsa: unknown key" in human.stdout
        assert "twin: SharedShape: same shape" in human.stdout
        assert "Ambiguous" in human.stdout
    finally:
        assert running.stop() == 0, running.log()
    log = running.log()
    assert "warm pool env: same shape" in log  # flagged when loaded, not only when listed
    assert "warm pool typo: invalid profile" in log
