"""A pod's workload against the init container's program: the agent is `warmshell-agent
--install DIR` as much as the workload's pid 1, and the workload can run it. The agent's volume is
read-only to the workload, so reinstalling over the agent that runs it, or planting the partial
file the install writes first, fails; the agent stays the one the init container copied, and it
keeps serving the pod."""

from __future__ import annotations

import pytest

import warmshell
from tests.helpers.gateway import RunningGateway
from tests.integration.drivers_kubernetes.conftest import cluster, gw  # noqa: F401
from warmshell.drivers.local.runtime.agent.installing import BUILT_AGENT

pytestmark = pytest.mark.timeout(180)

AGENT = "/.warmshell/agent/warmshell-agent"


async def test_the_workload_cannot_reinstall_or_replace_its_agent(gw: RunningGateway) -> None:  # noqa: F811
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        sb = await client.create(name="reinstall", ready_timeout=60)
        try:
            again = await sb.run([AGENT, "--install", "/.warmshell/agent"])
            assert again.exit_code == 1
            assert b"warmshell-agent --install: /.warmshell/agent: " in again.stderr
            assert b"read-only" in again.stderr.lower()
            for attempt in (
                f"cp /bin/sh {AGENT}",
                "ln -s /bin/sh /.warmshell/agent/.warmshell-agent.tmp",
                "echo x > /.warmshell/agent/.warmshell-agent.tmp",
            ):
                assert (await sb.run(["sh", "-c", attempt])).exit_code != 0, attempt
            listed = await sb.run(["ls", "-A", "/.warmshell/agent"])
            assert listed.stdout == b"warmshell-agent\n"
            agent = await sb.run(["cat", AGENT])
            assert agent.stdout == BUILT_AGENT.read_bytes()
            assert (await sb.run(["true"])).exit_code == 0  # the agent still serves the pod
        finally:
            await sb.delete()
