"""Snapshots of local sandboxes through a real gateway: what a sandbox of an image wrote over it
(deletions included) and its /workspace become an image of the store, on top of the base's layers;
the sandbox keeps running; a refusal leaves it unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, ready, sh
from warmshell.api.v1 import image_pb2 as image_pb
from warmshell.api.v1 import image_pb2_grpc
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.store import ImageStore

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]
# No Cmd: a sandbox of the image runs nothing but its agent (a shell as Cmd would exit at once).
IDLE_ENV = ["PATH=/usr/bin:/bin"]


async def snapshot(gw: RunningGateway, name: str, image: str, *, force: bool = False) -> pb.SnapshotSandboxResponse:
    request = pb.SnapshotSandboxRequest(name=name, image=image, force=force)
    response: pb.SnapshotSandboxResponse = await gw.stub.SnapshotSandbox(request, metadata=gw.metadata)
    return response


async def inspect(gw: RunningGateway, ref: str) -> image_pb.Image:
    stub = image_pb2_grpc.ImageServiceStub(gw.channel)
    image: image_pb.Image = await stub.GetImage(image_pb.ImageRef(ref=ref), metadata=gw.metadata)
    return image


SETUP = (
    "echo changed > /etc/warmshell-test-marker && mkdir -p /opt/app && echo built > /opt/app/out "
    "&& rm /usr/bin/head && mkdir -p /usr/share/gone && rm -rf /usr/share/gone "
    "&& echo work > /workspace/notes && mkdir /workspace/src && echo code > /workspace/src/main.c "
    "&& ln -s /etc/passwd /workspace/link && echo tmp > /tmp/not-kept"
)


async def test_a_snapshot_is_the_base_plus_what_the_sandbox_wrote_and_the_sandbox_runs_on(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    base = import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    async with running_gateway(state) as gw:
        await ready(gw, "prep", "tiny:1")
        assert (await sh(gw, "prep", SETUP))[0] == 0
        taken = await snapshot(gw, "prep", "prepared:1")
        assert taken.base_digest == base
        assert (taken.layers, taken.flattened) == (2, False)
        # The sandbox was thawed and keeps its state.
        assert await sh(gw, "prep", "cat /workspace/notes; echo more >> /workspace/notes") == (0, "work\n", "")
        image = await inspect(gw, "prepared:1")
        assert (image.source_sandbox, image.base_digest) == ("default/prep", base)
        assert image.layers[0].digest == (await inspect(gw, "tiny:1")).layers[0].digest  # the base, shared
        await ready(gw, "child", "prepared:1")
        script = (
            "cat /etc/warmshell-test-marker /opt/app/out /workspace/notes /workspace/src/main.c; "
            "[ -L /workspace/link ] && echo link; [ -e /usr/bin/head ] || echo no-head; "
            "[ -e /tmp/not-kept ] || echo no-tmp; "
            "[ -e /usr/share/gone ] || echo no-gone; cat /proc/1/comm"
        )
        code, out, _ = await sh(gw, "child", script)
        assert code == 0
        assert out == "changed\nbuilt\nwork\ncode\nlink\nno-head\nno-tmp\nno-gone\nwarmshell-agent\n"
        # The child's /workspace is its own: writes go to its own layer, not the image or the parent.
        assert (await sh(gw, "child", "echo child >> /workspace/notes && rm /workspace/src/main.c"))[0] == 0
        assert await sh(gw, "prep", "cat /workspace/notes; ls /workspace/src") == (0, "work\nmore\nmain.c\n", "")
        await ready(gw, "other", "prepared:1")
        assert await sh(gw, "other", "cat /workspace/notes; ls /workspace/src") == (0, "work\nmain.c\n", "")
        # A snapshot of a snapshot: one more layer, its workspace from the root's own layer.
        again = await snapshot(gw, "child", "prepared:2")
        assert (again.layers, again.base_digest) == (3, taken.digest)
        await ready(gw, "grandchild", "prepared:2")
        assert await sh(gw, "grandchild", "cat /workspace/notes; ls /workspace/src") == (0, "work\nchild\n", "")


async def test_bad_snapshots_are_refused_naming_the_field_and_change_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    async with running_gateway(state) as gw:
        await ready(gw, "prep", "tiny:1")
        await gw.create(name="host", spec=pb.SandboxSpec())
        await gw.wait_ready("host")
        refusals = [
            ("prep", "tiny:1", grpc.StatusCode.ALREADY_EXISTS, "--force"),
            ("prep", "", grpc.StatusCode.INVALID_ARGUMENT, "image: "),
            ("prep", "Bad Name", grpc.StatusCode.INVALID_ARGUMENT, "image: "),
            ("nope", "x:1", grpc.StatusCode.NOT_FOUND, "nope"),
            ("host", "x:1", grpc.StatusCode.FAILED_PRECONDITION, "host's root filesystem"),
        ]
        for name, image, code, words in refusals:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await snapshot(gw, name, image)
            assert caught.value.code() == code, (name, image, caught.value)
            assert words in (caught.value.details() or ""), caught.value.details()
        assert (await snapshot(gw, "prep", "tiny:1", force=True)).layers == 2  # --force moves the tag
        assert await sh(gw, "prep", "echo alive") == (0, "alive\n", "")


async def test_a_snapshot_past_the_store_bound_is_resource_exhausted_and_leaves_the_sandbox_running(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    store = ImageStore(state / "images", max_bytes=1 << 30)
    used = store.usage()
    async with running_gateway(state, **{"local.image_store_size": str(used + (4 << 20))}) as gw:
        await ready(gw, "big", "tiny:1")
        assert (await sh(gw, "big", "head -c 8388608 /dev/urandom > /workspace/blob"))[0] == 0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await snapshot(gw, "big", "big:1")
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "local.image_store_size" in (caught.value.details() or "")
        assert await sh(gw, "big", "[ -s /workspace/blob ] && echo kept") == (0, "kept\n", "")
        assert "big:1" not in store.index().tags
        assert list((state / "images" / "staging").iterdir()) == []
        assert len(list((state / "images" / "layers" / "sha256").iterdir())) == 1


async def test_past_max_layers_a_snapshot_is_flattened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    async with running_gateway(state, **{"local.max_layers": 2}) as gw:
        await ready(gw, "a", "tiny:1")
        assert (await sh(gw, "a", "echo one > /workspace/f && rm /usr/bin/head"))[0] == 0
        assert (await snapshot(gw, "a", "chain:1")).layers == 2
        await ready(gw, "b", "chain:1")
        assert (await sh(gw, "b", "echo two >> /workspace/f"))[0] == 0
        flat = await snapshot(gw, "b", "chain:2")
        assert (flat.layers, flat.flattened) == (1, True)
        await ready(gw, "c", "chain:2")
        script = "cat /workspace/f /etc/warmshell-test-marker; [ -e /usr/bin/head ] || echo no-head"
        assert await sh(gw, "c", script) == (0, "one\ntwo\nbuilt by the testsno-head\n", "")


async def test_a_snapshot_as_a_pool_image_serves_warm_creates_with_its_workspace(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "prepared.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 2\nimage = "prepared:1"\n')
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(state, **settings) as gw:
        await ready(gw, "prep", "tiny:1")
        assert (await sh(gw, "prep", "echo deps > /workspace/installed && mkdir -p /opt/venv"))[0] == 0
        taken = await snapshot(gw, "prep", "prepared:1")
        listed = await wait_pools(gw, lambda r: (p := pool_named(r, "prepared")) is not None and p.idle >= 2)
        assert pool_named(listed, "prepared").image == f"prepared:1@{taken.digest}"  # type: ignore[union-attr]
        for name in ("warm-1", "warm-2"):
            warm = await ready(gw, name, "prepared:1")
            assert (warm.status.allocation, warm.status.pool) == ("warm", "prepared")
            assert await sh(gw, name, "cat /workspace/installed; ls -d /opt/venv") == (0, "deps\n/opt/venv\n", "")
        assert (await sh(gw, "warm-1", "echo mine >> /workspace/installed"))[0] == 0
        assert await sh(gw, "warm-2", "cat /workspace/installed") == (0, "deps\n", "")
