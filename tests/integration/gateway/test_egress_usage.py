"""Egress bytes in a sandbox's usage: every byte through the gateway's egress proxy, out of the
sandbox and into it, counted per sandbox for as long as it lives (real bwrap'd sandboxes, a real
upstream on the host), in GetSandbox, `info().usage` and `sandbox get`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.upstreams import Upstream, upstream
from tests.integration.security.support import sandbox, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", **{"network.requests_may_widen": True}) as running:
        yield running


@pytest.fixture
async def allowed() -> AsyncIterator[Upstream]:
    async with upstream("127.0.0.2") as server:
        yield server


async def usage(gw: RunningGateway, name: str) -> pb.SandboxUsage:
    return (await gw.stub.GetSandbox(pb.SandboxRef(name=name), metadata=gw.metadata)).status.usage


async def test_egress_bytes_are_counted_per_sandbox(gw: RunningGateway, allowed: Upstream) -> None:
    spec = pb.SandboxSpec(network=pb.NetworkPolicy(allow=[allowed.authority]))
    await sandbox(gw, "talker", spec)
    await sandbox(gw, "quiet", spec)
    before = await usage(gw, "talker")
    assert (before.egress_bytes_out, before.egress_bytes_in) == (0, 0)
    upload = "head -c 100000 /dev/zero | curl -sS --fail-with-body -o /dev/null --data-binary @-"
    for _ in range(2):
        code, _, err = await sh(gw, "talker", f"{upload} http://{allowed.authority}/up")
        assert code == 0, err
    decisions = (await gw.stub.ListEgress(pb.SandboxRef(name="talker"), metadata=gw.metadata)).decisions
    after = await usage(gw, "talker")
    assert after.egress_bytes_out == sum(d.bytes_up for d in decisions) > 200_000
    assert after.egress_bytes_in == sum(d.bytes_down for d in decisions) > 0
    # Another sandbox's traffic is its own.
    quiet = await usage(gw, "quiet")
    assert (quiet.egress_bytes_out, quiet.egress_bytes_in) == (0, 0)
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        info = await (await client.get("talker")).info()
    assert info.usage is not None
    assert (info.usage.egress_bytes_out, info.usage.egress_bytes_in) == (after.egress_bytes_out, after.egress_bytes_in)
    details = render.sandbox_details(await gw.stub.GetSandbox(pb.SandboxRef(name="talker"), metadata=gw.metadata))
    assert f"{render.format_bytes(after.egress_bytes_out)} out" in details


async def test_a_sandbox_without_a_proxy_reports_no_egress_figure(gw: RunningGateway) -> None:
    await sandbox(gw, "closed", pb.SandboxSpec())
    figures = await usage(gw, "closed")
    assert not figures.HasField("egress_bytes_out")
    assert not figures.HasField("egress_bytes_in")
