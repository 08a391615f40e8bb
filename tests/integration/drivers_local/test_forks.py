"""Forks of local sandboxes through a real gateway: N children on one snapshot of the parent, each
with the parent's files (checked by hash), a /workspace of its own that no sibling or the parent
sees, its own name and id; bad requests refused naming the field, before anything is made."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, ready, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.store import ImageStore

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]
# No Cmd: a sandbox of the image runs nothing but its agent (a shell as Cmd would exit at once).
IDLE_ENV = ["PATH=/usr/bin:/bin"]

FILL = (
    "mkdir -p /workspace/data && for i in 1 2 3 4 5; do head -c 10000000 /dev/urandom > /workspace/data/$i; done "
    "&& echo parent > /workspace/who && cd /workspace/data && sha256sum 1 2 3 4 5"
)


async def fork(gw: RunningGateway, name: str, count: int, **fields: object) -> pb.ForkSandboxResponse:
    request = pb.ForkSandboxRequest(name=name, count=count, ready_timeout_ms=120_000, **fields)  # type: ignore[arg-type]
    response: pb.ForkSandboxResponse = await gw.stub.ForkSandbox(request, metadata=gw.metadata, timeout=300)
    return response


async def test_ten_children_share_the_parents_files_and_keep_their_writes_to_themselves(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", extra_tools=("sha256sum",), Env=IDLE_ENV)
    async with running_gateway(state, **{"local.root_size": "256Mi"}) as gw:
        parent = await ready(gw, "parent", "tiny:1")
        code, sums, err = await sh(gw, "parent", FILL)
        assert code == 0, err
        response = await fork(gw, "parent", 10)
        names = [f"parent-fork-{i}" for i in range(1, 11)]
        assert [c.name for c in response.children] == names
        assert all(not c.error_code and c.sandbox.status.phase == pb.SANDBOX_PHASE_READY for c in response.children)
        ids = {c.sandbox.id for c in response.children} | {parent.id}
        assert len(ids) == 11
        assert all(c.sandbox.spec.image.endswith(response.image_digest) for c in response.children)
        for name in names:
            assert await sh(gw, name, "cd /workspace/data && sha256sum 1 2 3 4 5") == (0, sums, "")
        # One layer for all of them: the 50 MB are stored once, not once per child.
        store = ImageStore(state / "images", max_bytes=1 << 40)
        assert store.resolve(response.image_digest).layers[-1] in store.index().layers
        assert store.usage() < 2 * 50_000_000 + 20_000_000
        assert (await sh(gw, names[0], "echo child1 > /workspace/who && rm /workspace/data/1"))[0] == 0
        assert (await sh(gw, "parent", "echo later > /workspace/late"))[0] == 0
        for name in names[1:3]:
            assert await sh(
                gw, name, "cat /workspace/who; ls /workspace/data; ls /workspace/late 2>&1 | grep -c No"
            ) == (
                0,
                "parent\n1\n2\n3\n4\n5\n1\n",
                "",
            )
        assert await sh(gw, "parent", "cat /workspace/who; ls /workspace/data | head -1") == (0, "parent\n1\n", "")


async def test_bad_forks_are_refused_naming_the_field_and_make_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    async with running_gateway(state, **{"local.max_fork_count": 3}) as gw:
        await ready(gw, "p", "tiny:1")
        await ready(gw, "taken-1", "tiny:1")
        store = ImageStore(state / "images", max_bytes=1 << 40)
        images_before = set(store.index().images)
        refusals = [
            ({"count": 0}, grpc.StatusCode.INVALID_ARGUMENT, "count: "),
            ({"count": 4}, grpc.StatusCode.INVALID_ARGUMENT, "local.max_fork_count"),
            ({"count": 1, "prefix": "Bad_Prefix"}, grpc.StatusCode.INVALID_ARGUMENT, "prefix: "),
            ({"count": 2, "prefix": "taken"}, grpc.StatusCode.ALREADY_EXISTS, "prefix: "),
        ]
        for fields, code, words in refusals:
            count = int(fields.pop("count"))  # type: ignore[call-overload]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await fork(gw, "p", count, **fields)
            assert caught.value.code() == code, (fields, caught.value)
            assert words in (caught.value.details() or ""), caught.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await fork(gw, "nope", 1)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert set(store.index().images) == images_before  # no snapshot was taken for a refused fork
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        assert sorted(s.name for s in listed.sandboxes) == ["p", "taken-1"]
