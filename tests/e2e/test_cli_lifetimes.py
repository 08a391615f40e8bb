"""`sandbox create --ttl/--idle-timeout/--rm` and how `sandbox get`/`list` show a sandbox's
expiry and the Exited phase, typed as a user would against a real gateway process."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import CliGateway, start_gateway


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[CliGateway]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path / "state")
    try:
        yield running
    finally:
        status = running.stop()
        assert status == 0, f"gateway exited with {status} after SIGTERM:\n{running.log()}"


def test_ttl_and_idle_timeout_show_in_get(gateway: CliGateway) -> None:
    before_ms = time.time() * 1000
    created = gateway.run("sandbox", "create", "--name", "timed", "--ttl", "600", "--idle-timeout", "120", "-o", "json")
    assert created.returncode == 0, created.stderr + gateway.log()
    lifetime = json.loads(created.stdout)["lifetime"]
    assert lifetime["ttl_seconds"] == 600
    assert lifetime["idle_timeout_seconds"] == 120
    assert before_ms + 599_000 <= int(lifetime["expires_at_ms"]) <= time.time() * 1000 + 600_000
    shown = gateway.run("sandbox", "get", "timed")
    assert shown.returncode == 0, shown.stderr
    expires = next(line for line in shown.stdout.splitlines() if line.startswith("Expires"))
    assert "(ttl 600 s); after 120 s without an exec" in expires


def test_a_plain_create_expires_and_a_ttl_past_the_maximum_is_refused(gateway: CliGateway) -> None:
    created = gateway.run("sandbox", "create", "--name", "plain")
    assert created.returncode == 0, created.stderr + gateway.log()
    shown = gateway.run("sandbox", "get", "plain")
    expires = next(line for line in shown.stdout.splitlines() if line.startswith("Expires"))
    assert "(ttl 3600 s)" in expires  # the gateway's default, not "never"
    refused = gateway.run("sandbox", "create", "--name", "long", "--ttl", "999999")
    assert refused.returncode == 5, refused.stderr
    assert refused.stderr.startswith("error: ttl_seconds: 999999 s is beyond the gateway's maximum of 86400 s")


def test_rm_deletes_once_the_output_is_delivered_and_exited_reads_as_finished(gateway: CliGateway) -> None:
    ran = gateway.run("sandbox", "create", "--name", "once", "--rm", "--", "sh", "-c", "echo done; exit 4")
    assert (ran.returncode, ran.stdout) == (4, "done\n"), ran.stderr + gateway.log()
    gone = gateway.run("sandbox", "get", "once")
    assert gone.returncode == 3, gone.stdout  # not found: --rm removed it

    kept = gateway.run("sandbox", "create", "--name", "kept", "--", "true")
    assert kept.returncode == 0, kept.stderr
    listed = gateway.run("sandbox", "list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("kept"))
    assert "Exited (0)" in row
    phase = next(line for line in gateway.run("sandbox", "get", "kept").stdout.splitlines() if line.startswith("Phase"))
    assert phase.split() == ["Phase", "Exited", "(0)"]


def test_rm_needs_a_command(gateway: CliGateway) -> None:
    refused = gateway.run("sandbox", "create", "--rm")
    assert refused.returncode == 2
    assert "--rm" in refused.stderr
    assert "needs a command" in refused.stderr
