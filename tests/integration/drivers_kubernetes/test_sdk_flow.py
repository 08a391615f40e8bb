"""The SDK on the Kubernetes driver (kubesim): an agent's flow through `warmshell.AsyncClient`
against a real gateway whose sandboxes are agent-sandbox pods started by the kubelet."""

from __future__ import annotations

import warmshell
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway

from .conftest import NAMESPACE


async def test_sdk_flow_on_kubesim(gw: RunningGateway, admin: kc.KubeClient) -> None:
    state = gw.gateway.config.state_dir
    async with warmshell.AsyncClient(state_dir=state) as client:
        sb = await client.create(name="agent", env={"GREETING": "hello"}, ttl_seconds=600, ready_timeout=60)
        assert sb.last_info.phase is warmshell.Phase.READY
        pod = await admin.get(kc.PODS, NAMESPACE, "default--agent")
        assert sb.last_info.instance_id == pod["metadata"]["uid"]
        wrote = await sb.run(["sh", "-c", "cat > /workspace/task.sh"], stdin='echo "$GREETING from $(pwd)"\n')
        assert wrote.exit_code == 0
        ran = await sb.run(["sh", "/workspace/task.sh"], timeout=30)
        assert (ran.exit_code, ran.stdout) == (0, b"hello from /workspace\n")
        chunks = [e async for e in sb.run_stream(["sh", "-c", "echo one; echo two >&2; exit 3"])]
        assert chunks[-1].exit_code == 3
        info = await sb.refresh_ttl(900)
        assert info.lifetime.ttl_seconds == 900
        assert [i.name for i in await client.list()] == ["agent"]
        assert await sb.delete() is True

        job = await client.create(name="job", command=["sh", "-c", "echo done; exit 0"], auto_delete=True)
        result = await job.wait_exit(timeout=60)
        assert (result.exit_code, result.stdout) == (0, b"done\n")
        assert job.last_info.phase is warmshell.Phase.EXITED
        assert await client.list() == []
