"""Usage per sandbox through a real gateway process (local driver, real bwrap and cgroups): the
figures `sandbox get` shows, in both SDK clients' `info().usage`, in the CLI (text and JSON), and
the per-sandbox Prometheus gauges with their cap."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator

import pytest

import warmshell
from tests.helpers.cli import CliGateway, configured_gateway

MiB = 2**20
# One sandbox listed per scrape, read afresh on every scrape: the cap is observable in one test.
CONFIG = """
[metrics]
per_sandbox_limit = 1
per_sandbox_refresh_seconds = 0
"""
BUSY = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    with configured_gateway(tmp_path_factory.mktemp("usage"), CONFIG) as running:
        yield running


@pytest.fixture
def client(gateway: CliGateway) -> Iterator[warmshell.Client]:
    with warmshell.Client(state_dir=gateway.state_dir) as client:
        try:
            yield client
        finally:
            for info in client.list(all_workspaces=True):
                client.get(info.name, workspace=info.workspace).delete()


def scrape(gateway: CliGateway) -> dict[str, float]:
    """The per-sandbox series of /metrics, by their line's name and labels."""
    with urllib.request.urlopen(f"http://{gateway.info['http']}/metrics", timeout=10) as response:
        text = response.read().decode()
    series = {}
    for line in text.splitlines():
        if line.startswith("warmshell_sandbox_") and not line.startswith("warmshell_sandbox_creates"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def test_get_shows_what_a_sandbox_uses_in_both_clients_and_the_cli(
    gateway: CliGateway, client: warmshell.Client
) -> None:
    with client.create(name="user") as sb:
        assert sb.run(["python3", "-c", BUSY]).exit_code == 0
        written = sb.run(["sh", "-c", "head -c 5242880 /dev/zero > /workspace/blob; sleep 60 >/dev/null 2>&1 &"])
        assert written.exit_code == 0
        usage = sb.info().usage
        assert usage is not None
        assert usage.unknown == "", usage.unknown  # as root on a host with cgroups: every figure
        assert usage.cpu_seconds is not None
        assert usage.cpu_seconds >= 0.5
        assert usage.memory_bytes is not None
        assert usage.memory_peak_bytes is not None
        assert 0 < usage.memory_bytes <= usage.memory_peak_bytes
        assert usage.processes is not None
        assert usage.processes >= 2
        assert usage.workspace_bytes is not None
        assert 5 * MiB <= usage.workspace_bytes < 6 * MiB
        assert usage.root_bytes is None  # no writable root of its own: unset, not 0
        assert usage.read_at_ms > 0

        async def async_usage() -> warmshell.Usage | None:
            async with warmshell.AsyncClient(state_dir=gateway.state_dir) as aclient:
                return (await (await aclient.get("user")).info()).usage

        seen = asyncio.run(async_usage())
        assert seen is not None
        assert seen.workspace_bytes == usage.workspace_bytes

        document = json.loads(gateway.run("sandbox", "get", "user", "-o", "json").stdout)
        assert document["status"]["usage"]["workspace_bytes"] == usage.workspace_bytes
        text = gateway.run("sandbox", "get", "user").stdout
        assert any(line.split() == ["/workspace", "5.0MiB"] for line in text.splitlines()), text
        assert "Usage unknown" not in text

        # A listing stays as cheap as before: no usage read, none carried.
        (listed,) = client.list()
        assert listed.usage is None


def test_an_ended_sandbox_says_why_its_usage_is_unknown(client: warmshell.Client) -> None:
    sb = client.create(name="oneshot", command=["true"])
    assert sb.wait_exit().exit_code == 0
    info = sb.info()
    assert info.usage is not None
    assert info.usage.cpu_seconds is None
    assert "Exited, not running" in info.usage.unknown
    sb.delete()


def test_the_gauges_list_the_busiest_sandboxes_up_to_the_cap(gateway: CliGateway, client: warmshell.Client) -> None:
    with client.create(name="busy") as busy, client.create(name="idle"):
        assert busy.run(["python3", "-c", BUSY]).exit_code == 0
        series = scrape(gateway)
        assert 'warmshell_sandbox_cpu_seconds{name="busy",workspace="default"}' in series, series
        assert not any('name="idle"' in name for name in series), series
        assert series["warmshell_sandbox_usage_unlisted"] == 1.0
        assert series['warmshell_sandbox_workspace_bytes{name="busy",workspace="default"}'] >= 0
    after = scrape(gateway)  # deleted: no series left behind
    assert not any('name="busy"' in name for name in after), after
    assert after["warmshell_sandbox_usage_unlisted"] == 0.0
