"""The SDK example under examples/sdk runs as a user would run it, against a real gateway with
warm pools, and leaves no sandbox behind."""

from __future__ import annotations

import subprocess
import sys

import warmshell
from tests.helpers.cli import CliGateway, warmshell_env
from tests.integration.sdk.conftest import REPO, wait_pool_idle


def test_the_agent_step_example(gateway: CliGateway, client: warmshell.Client) -> None:
    wait_pool_idle(client, "default")
    ran = subprocess.run(
        [sys.executable, str(REPO / "examples" / "sdk" / "agent_step.py")],
        env=warmshell_env(gateway.state_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr + gateway.log()
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("sandbox ")
    assert ": warm, Ready in " in lines[0]
    assert lines[1:] == ["wrote /workspace/answer.json", "answer: 385"]
    assert client.list(all_workspaces=True) == []
