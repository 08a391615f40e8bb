"""Attacks on the image store through a snapshot: whatever a hostile sandbox leaves in its writable
layer and /workspace (links to host paths, setuid files, FIFOs, odd names, sparse giants) becomes
a layer through the importer's rules, so it hurts neither the store nor a later sandbox of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny
from tests.integration.security.support import sandbox, sh, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.store import ImageStore

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]
# No Cmd: a sandbox of the image runs nothing but its agent (a shell as Cmd would exit at once).
IDLE_ENV = ["PATH=/usr/bin:/bin"]

EXTRA = ("truncate", "mkfifo", "stat")
PLANT = (
    "ln -s / /workspace/host-root && ln -s /etc/shadow /workspace/shadow && ln -s ../../../../.. /workspace/up "
    "&& cp /bin/sh /workspace/suid && chmod 4755 /workspace/suid && chmod 2755 /usr/bin/id "
    "&& mkfifo /workspace/fifo /etc/fifo && : > '/workspace/odd\nname' && : > /workspace/.wh..wh..opq "
    "&& mkdir -p /workspace/d && ln -s /etc /workspace/d/etc-link && ln /workspace/suid /workspace/hard"
)


async def snapshot(gw: RunningGateway, name: str, image: str) -> pb.SnapshotSandboxResponse:
    request = pb.SnapshotSandboxRequest(name=name, image=image)
    response: pb.SnapshotSandboxResponse = await gw.stub.SnapshotSandbox(request, metadata=gw.metadata)
    return response


def _layer_of(store: ImageStore, tag: str) -> Path:
    image = store.resolve(tag)
    return store.layer_path(image.layers[-1])


async def test_planted_links_setuid_files_and_fifos_become_harmless_entries(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", extra_tools=EXTRA, Env=IDLE_ENV)
    store = ImageStore(state / "images", max_bytes=1 << 30)
    base_layer = store.layer_path(store.resolve("tiny:1").layers[0])
    before = sorted(str(p.relative_to(base_layer)) for p in base_layer.rglob("*"))
    async with running_gateway(state) as gw:
        await sandbox(gw, "hostile", pb.SandboxSpec(image="tiny:1"))
        code, _, err = await sh(gw, "hostile", PLANT)
        assert code == 0, err
        await snapshot(gw, "hostile", "hostile:1")
        layer = _layer_of(store, "hostile:1")
        workspace = layer / "workspace"
        # Links are stored as links, never followed while the layer was written.
        assert os.readlink(workspace / "host-root") == "/"
        assert os.readlink(workspace / "up") == "../../../../.."
        assert not any(p.name == "shadow" and not p.is_symlink() for p in layer.rglob("shadow"))
        # No setuid or setgid bit reaches the store, and no FIFO.
        for path in layer.rglob("*"):
            info = os.lstat(path)
            assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
            assert not stat.S_ISFIFO(info.st_mode), path
        assert (workspace / "odd\nname").exists()
        assert os.stat(workspace / "hard").st_ino == os.stat(workspace / "suid").st_ino
        # The base layer is untouched, shared as it was.
        assert sorted(str(p.relative_to(base_layer)) for p in base_layer.rglob("*")) == before
        # A sandbox of the snapshot resolves the links inside its own root and gains no privilege.
        await sandbox(gw, "later", pb.SandboxSpec(image="hostile:1"))
        code, out, _ = await sh(
            gw, "later", "ls /workspace/host-root/; cat /workspace/shadow 2>&1; stat -c %a /workspace/suid"
        )
        lines = out.splitlines()
        assert "home" not in lines  # / of the sandbox: its own image, not the host's
        assert "No such file" in lines[-2]  # the image has no /etc/shadow: the host's is out of reach
        assert lines[-1] == "755"
        await still_real(gw, "later")
        await still_real(gw, "hostile")


def _harmless(layer: Path) -> None:
    """No setuid or setgid bit and no FIFO in the layer; planted links kept as links."""
    for path in layer.rglob("*"):
        info = os.lstat(path)
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
        assert not stat.S_ISFIFO(info.st_mode), path
    assert os.readlink(layer / "workspace" / "host-root") == "/"
    assert os.readlink(layer / "workspace" / "up") == "../../../../.."


async def test_a_forks_untagged_layer_copied_in_the_kernel_passes_the_same_rules(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", extra_tools=EXTRA, Env=IDLE_ENV)
    store = ImageStore(state / "images", max_bytes=1 << 30)
    async with running_gateway(state) as gw:
        await sandbox(gw, "hostile", pb.SandboxSpec(image="tiny:1"))
        code, _, err = await sh(gw, "hostile", PLANT)
        assert code == 0, err
        request = pb.ForkSandboxRequest(name="hostile", count=1, prefix="copy", ready_timeout_ms=30_000)
        forked = await gw.stub.ForkSandbox(request, metadata=gw.metadata)
        assert [c.error for c in forked.children] == [""]
        digest = store.resolve(forked.image_digest).layers[-1]
        assert not store.index().layers[digest].by_content  # the untagged path: no hash, a random name
        layer = store.layer_path(digest)
        _harmless(layer)
        workspace = layer / "workspace"
        assert os.stat(workspace / "hard").st_ino == os.stat(workspace / "suid").st_ino
        assert (workspace / "odd\nname").exists()
        code, out, _ = await sh(gw, "copy-1", "ls /workspace/host-root/; stat -c %a /workspace/suid; id -u")
        lines = out.splitlines()
        assert code == 0
        assert "home" not in lines
        assert lines[-2] == "755"
        await still_real(gw, "copy-1")
        await still_real(gw, "hostile")


async def test_a_sparse_giant_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", extra_tools=EXTRA, Env=IDLE_ENV)
    async with running_gateway(state, **{"local.image_store_size": "64Mi"}) as gw:
        await sandbox(gw, "sparse", pb.SandboxSpec(image="tiny:1"))
        assert (await sh(gw, "sparse", "truncate -s 3G /workspace/giant && truncate -s 2G /etc/giant"))[0] == 0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await snapshot(gw, "sparse", "sparse:1")
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert list((state / "images" / "staging").iterdir()) == []
        await still_real(gw, "sparse")


async def test_planted_whiteout_names_hide_nothing_outside_the_hostile_sandboxs_own_snapshot(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    store = ImageStore(state / "images", max_bytes=1 << 30)
    async with running_gateway(state) as gw:
        await sandbox(gw, "hostile", pb.SandboxSpec(image="tiny:1"))
        plant = ": > /.wh.etc && : > /usr/.wh..wh..opq && : > '/workspace/.wh.' && : > /workspace/.wh..wh..wh.x"
        code, _, err = await sh(gw, "hostile", plant)
        assert code == 0, err
        await snapshot(gw, "hostile", "hostile:1")
        layer = _layer_of(store, "hostile:1")
        assert {p.name for p in layer.iterdir()} >= {"etc", "usr"}  # whiteouts of its own layer, nothing more
        # The base image and every other sandbox of it are untouched.
        await sandbox(gw, "bystander", pb.SandboxSpec(image="tiny:1"))
        assert await sh(gw, "bystander", "cat /etc/warmshell-test-marker") == (0, "built by the tests", "")
        await still_real(gw, "bystander")
        await still_real(gw, "hostile")
