"""A supervisor runs nothing in its own namespaces: with no runner given (the local driver's) and
no agent socket (a pod's workload container), it stops before it registers."""

from __future__ import annotations

from pathlib import Path

from warmshell.supervisor.main import Supervisor, SupervisorSettings


async def test_without_an_agent_or_a_runner_the_supervisor_stops_before_registering(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a.b.c\n")
    # Nothing listens there: registering would fail differently, and slowly (retries).
    environ = {"WARMSHELL_GATEWAY": f"unix://{tmp_path / 'none.sock'}", "WARMSHELL_BOOTSTRAP_FILE": str(token)}
    supervisor = Supervisor(SupervisorSettings.from_environment(environ), {"PATH": "/usr/bin:/bin"})
    assert await supervisor.run() == 2
    assert supervisor.activation is None
