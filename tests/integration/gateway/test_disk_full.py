"""A full disk does not take the gateway down: a sandbox fills the small tmpfs that holds the
state dir (and its workspace); creates are refused with RESOURCE_EXHAUSTED naming what is full,
get, list and delete keep working, and deleting the offender frees the space (real gateway, real
bwrap'd sandbox, a real SQLite file on a real full file system)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture
def small_disk() -> Iterator[Path]:
    # Outside pytest's 0700 tmp_path: the sandboxes' own uids must reach their workspaces here.
    disk = Path(tempfile.mkdtemp(prefix="warmshell-small-disk-"))
    os.chmod(disk, 0o711)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0711", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
        disk.rmdir()


async def test_a_sandbox_filling_the_disk_leaves_get_list_and_delete_working(small_disk: Path) -> None:
    # A workspace on the host's disk (not the default, its own tmpfs), so that it can fill the
    # disk the store is on: what an operator who turns the workspace bound off risks.
    settings = {"local.sandbox_dir": str(small_disk / "sandboxes"), "local.workspace_size": ""}
    async with running_gateway(small_disk / "state", **settings) as gw:
        await gw.create(name="filler")
        await gw.create(name="bystander")
        assert (await gw.wait_ready("filler")).status.phase == pb.SANDBOX_PHASE_READY
        assert (await gw.wait_ready("bystander")).status.phase == pb.SANDBOX_PHASE_READY
        code, _, err = await gw.exec("filler", ["sh", "-c", "dd if=/dev/zero of=/workspace/fill bs=1M"])
        assert code != 0
        assert b"No space left on device" in err
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.create(name="more")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details() or ""
        assert "state store is full" in details
        assert str(small_disk / "state") in details
        assert "Unexpected" not in details
        # get, list and exec still work; the bystander is untouched.
        assert (await gw.get("bystander")).status.phase == pb.SANDBOX_PHASE_READY
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        assert {s.name for s in listed.sandboxes} == {"filler", "bystander"}
        assert (await gw.exec("bystander", ["echo", "ok"]))[:2] == (0, b"ok\n")
        # Deleting the offender works on the full disk and frees its space: creates work again.
        await gw.delete("filler")
        created = await gw.create(name="more")
        assert created.name == "more"
        assert (await gw.wait_ready("more")).status.phase == pb.SANDBOX_PHASE_READY
