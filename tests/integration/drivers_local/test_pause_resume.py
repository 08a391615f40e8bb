"""Pause and resume of local sandboxes through a real gateway: a pause keeps the files as an image
and leaves no process, no tmpfs and no runtime; the record stays, Paused, in listings; a resume
starts it again from those files with a fresh activation; a paused sandbox's delete removes its
files, and one never resumed is deleted after its pause TTL."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, ready, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.ids import SandboxId
from warmshell.drivers.local.imagestore.store import ImageStore

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]
# No Cmd: a sandbox of the image runs nothing but its agent (a shell as Cmd would exit at once).
IDLE_ENV = ["PATH=/usr/bin:/bin"]


def processes_of(instance_id: str) -> list[int]:
    """Host processes whose environment names the sandbox's instance (its agent, its commands)."""
    found = []
    marker = f"WARMSHELL_INSTANCE_ID={instance_id}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def pause(gw: RunningGateway, name: str, ttl: int = 0) -> pb.Sandbox:
    request = pb.PauseSandboxRequest(name=name, pause_ttl_seconds=ttl)
    paused: pb.Sandbox = await gw.stub.PauseSandbox(request, metadata=gw.metadata)
    return paused


async def resume(gw: RunningGateway, name: str) -> pb.Sandbox:
    request = pb.ResumeSandboxRequest(name=name, wait_ready=True, ready_timeout_ms=60_000)
    resumed: pb.Sandbox = await gw.stub.ResumeSandbox(request, metadata=gw.metadata)
    return resumed


async def test_pause_leaves_nothing_running_and_resume_brings_the_files_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    async with running_gateway(state) as gw:
        first = await ready(gw, "napper", "tiny:1")
        assert processes_of(first.status.instance_id)
        script = "echo kept > /workspace/notes && mkdir -p /opt/x && echo also > /opt/x/y && echo gone > /tmp/t"
        assert (await sh(gw, "napper", script))[0] == 0
        session = gw.gateway.parts.manager.sessions.get(SandboxId(first.id))
        assert session is not None
        closed: list[tuple[str, bool]] = []
        close = session.close

        def told(reason: str = "", **options: Any) -> None:
            closed.append((reason, options.get("reconnect", False)))
            close(reason, **options)

        session.close = told  # type: ignore[method-assign]
        paused = await pause(gw, "napper")
        assert paused.status.phase == pb.SANDBOX_PHASE_PAUSED
        # Its supervisor is told to stop: one that took the end for a lost gateway reconnected,
        # to be refused (a pod's exits 1 on that, and its kubelet would start it again).
        assert closed[0] == ("the sandbox was paused", False)  # the first close; later ones do nothing
        assert (paused.id, paused.name) == (first.id, "napper")
        assert processes_of(first.status.instance_id) == []
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        assert [(s.name, s.status.phase) for s in listed.sandboxes] == [("napper", pb.SANDBOX_PHASE_PAUSED)]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await sh(gw, "napper", "true")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pause(gw, "napper")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        resumed = await resume(gw, "napper")
        assert resumed.status.phase == pb.SANDBOX_PHASE_READY
        assert resumed.id == first.id
        assert resumed.status.instance_id != first.status.instance_id  # a new runtime, activated afresh
        code, out, _ = await sh(gw, "napper", "cat /workspace/notes /opt/x/y; [ -e /tmp/t ] || echo no-tmp")
        assert (code, out) == (0, "kept\nalso\nno-tmp\n")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await resume(gw, "napper")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_deleting_a_paused_sandbox_removes_its_files_and_an_unresumed_one_expires(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    store = ImageStore(state / "images", max_bytes=1 << 40)
    async with running_gateway(state, **{"lifetimes.check_interval_seconds": 0.2}) as gw:
        await ready(gw, "gone", "tiny:1")
        assert (await sh(gw, "gone", "echo x > /workspace/x"))[0] == 0
        await pause(gw, "gone")
        assert len(store.index().images) == 2
        await gw.stub.DeleteSandbox(pb.SandboxRef(name="gone"), metadata=gw.metadata)
        assert len(store.index().images) == 1  # its snapshot went with it
        assert len(store.index().layers) == 1
        await ready(gw, "short", "tiny:1")
        await pause(gw, "short", ttl=1)
        async with asyncio.timeout(20):
            while (await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)).sandboxes:
                await asyncio.sleep(0.2)
        assert len(store.index().images) == 1
