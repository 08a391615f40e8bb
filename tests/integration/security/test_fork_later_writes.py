"""Attacks on a fork's sharing: a parent that goes on writing its files after the fork, in every
way a process can (in place through the name, a truncating rewrite, an append through a
descriptor it held open across the fork), never changes what its children see. A fork whose layer
shared the parent's inodes (hard links within its tmpfs, or its files moved into the layer and
fresh copies made for it) would fail here: `bench/investigations/fork-copy`, part 2."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.helpers.gateway import running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, ready, sh
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]
IDLE_ENV = ["PATH=/usr/bin:/bin"]

SETUP = "printf original > /workspace/in-place && printf original > /workspace/rewritten && : > /workspace/log"
# Holds /workspace/log open for appending from before the fork until /workspace/go appears (made
# after the fork), then writes through that descriptor and over the other two files.
HOLDER = (
    "exec 3>> /workspace/log; echo before >&3; "
    "while [ ! -e /workspace/go ]; do sleep 0.02; done; "
    "echo after >&3; printf PARENT 1<> /workspace/in-place; printf PARENT > /workspace/rewritten; echo done"
)
READ = "cat /workspace/in-place; echo; cat /workspace/rewritten; echo; cat /workspace/log"


async def test_a_parents_writes_after_the_fork_never_reach_its_children(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    async with running_gateway(state, **{"local.root_size": "64Mi"}) as gw:
        await ready(gw, "parent", "tiny:1")
        assert (await sh(gw, "parent", SETUP))[0] == 0
        holder = asyncio.create_task(sh(gw, "parent", HOLDER))
        for _ in range(500):  # the holder has its descriptor once it wrote through it
            if (await sh(gw, "parent", "cat /workspace/log"))[1] == "before\n":
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the parent's writer never opened its log")
        request = pb.ForkSandboxRequest(name="parent", count=2, ready_timeout_ms=120_000)
        response = await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)
        assert all(c.sandbox.status.phase == pb.SANDBOX_PHASE_READY for c in response.children), response
        assert (await sh(gw, "parent", ": > /workspace/go"))[0] == 0
        assert await asyncio.wait_for(holder, 60) == (0, "done\n", "")
        assert (await sh(gw, "parent", READ))[1] == "PARENTal\nPARENT\nbefore\nafter\n"
        for child in response.children:
            assert await sh(gw, child.name, READ) == (0, "original\noriginal\nbefore\n", "")
