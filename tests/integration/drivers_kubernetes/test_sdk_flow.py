"""The SDK on the Kubernetes driver (kubesim): an agent's flow through `warmshell.AsyncClient`
against a real gateway whose sandboxes are agent-sandbox pods started by the kubelet, and the
creates that fail (SandboxError with the gateway's reason) or are not Ready in time
(DeadlineExceeded), each leaving nothing behind."""

from __future__ import annotations

import asyncio

import pytest

import warmshell
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway

from .conftest import BROKEN_IMAGE, NAMESPACE


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
        # The exec ends with its command, not with a background child holding its stdout.
        background = await asyncio.wait_for(sb.run(["sh", "-c", "sleep 100 & echo $!"]), 30)
        assert (await sb.run(["kill", "-0", background.stdout.decode().strip()])).exit_code == 0
        # The pod's cgroups are the kubelet's: the driver reports no usage, and says so.
        usage = (await sb.info()).usage
        assert usage == warmshell.Usage(
            unknown="the kubernetes driver does not report usage", read_at_ms=usage.read_at_ms
        )
        # The in-pod supervisor's outcomes: in the result, never in the command's output.
        slow = await sb.run(["sleep", "30"], timeout=1)
        assert (slow.exit_code, slow.timed_out, slow.signal, slow.stderr) == (124, True, 9, b"")
        missing = await sb.run(["no-such-program"])
        assert (missing.exit_code, missing.error, missing.stderr) == (127, warmshell.ExecError.COMMAND_NOT_FOUND, b"")
        nowhere = await sb.run(["true"], workdir="/nope")
        assert (nowhere.error, nowhere.outcome.error_message) == (
            warmshell.ExecError.WORKDIR,
            "workdir /nope does not exist",
        )
        with pytest.raises(warmshell.CommandFailed, match="exited 3"):
            await sb.run(["sh", "-c", "exit 3"], check=True)
        terminal = await sb.start(["no-such-shell"], tty=True)
        async with terminal:
            assert await terminal.wait() == 127
        assert terminal.outcome is not None
        assert terminal.outcome.error is warmshell.ExecError.COMMAND_NOT_FOUND
        info = await sb.refresh_ttl(900)
        assert info.lifetime.ttl_seconds == 900
        assert [i.name for i in await client.list()] == ["agent"]
        assert await sb.delete() is True

        job = await client.create(name="job", command=["sh", "-c", "echo done; exit 0"], auto_delete=True)
        result = await job.wait_exit(timeout=60)
        assert (result.exit_code, result.stdout) == (0, b"done\n")
        assert job.last_info.phase is warmshell.Phase.EXITED
        assert await client.list() == []


async def test_a_failed_create_raises_sandbox_error_and_leaves_nothing(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(state_dir=gw.gateway.config.state_dir) as client:
        with pytest.raises(warmshell.SandboxError) as failed:
            await client.create(name="doomed", image=BROKEN_IMAGE, ready_timeout=60)
        assert failed.value.reason == "BackendFailed"
        assert "exited with code 3" in str(failed.value)
        assert failed.value.sandbox is not None
        assert failed.value.sandbox.phase is warmshell.Phase.ERROR
        assert await client.list() == []


async def test_a_create_not_ready_in_time_raises_deadline_exceeded_and_is_removed(gw: RunningGateway) -> None:
    # A pod takes far longer than 10 ms to start and register.
    state = gw.gateway.config.state_dir
    async with warmshell.AsyncClient(state_dir=state) as client:
        with pytest.raises(warmshell.DeadlineExceeded, match=r"was not Ready within 0\.01 s") as late:
            await client.create(name="slow", ready_timeout=0.01)
        assert isinstance(late.value, TimeoutError)
        assert await client.list() == []

        def sync_create() -> None:
            with warmshell.Client(state_dir=state) as sync_client:
                sync_client.create(name="slow-sync", ready_timeout=0.01)

        with pytest.raises(warmshell.DeadlineExceeded):
            await asyncio.to_thread(sync_create)
        assert await client.list() == []
