"""Sandboxes from images of the image store, through a real gateway: the image's layers are the
root, read-only and shared, under a writable layer of each sandbox's own; the reference is pinned
to its digest; an unknown image is refused naming `spec.image` and how to import it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.helpers import images
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.local.imagestore.importing import import_image
from warmshell.drivers.local.imagestore.store import ImageStore

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]


TOOLS = ("cat", "head", "id", "ls", "mkdir")


def tools_layer(marker: str) -> images.Layer:
    """The host's /bin/sh and a few coreutils with the libraries they load, and a marker."""
    layer = images.host_shell_layer(marker)
    have = {info.name for info, _ in layer.members}
    for tool in TOOLS:
        path = f"/usr/bin/{tool}"
        ldd = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
        for source in [path, *re.findall(r"=> (/\S+) \(0x", ldd)]:
            real = os.path.realpath(source).strip("/")
            if real not in have:
                have.add(real)
                layer.file(real, Path("/" + real).read_bytes(), mode=0o755)
            name = source.strip("/")
            if name not in have:  # /lib is a link to usr/lib on the host: the image gets one too
                have.add(name)
                layer.link(name, "/" + real)
    return layer


def import_tiny(state: Path, source: Path, *, name: str = "tiny:1", marker: str = "built by the tests") -> str:
    """Import a one-layer image (the host's /bin/sh and a few tools, a marker) into the gateway's
    store; its digest."""
    images.write_oci_layout(source, [tools_layer(marker).tar()])
    store = ImageStore(state / "images", max_bytes=1 << 30)
    store.open()
    image, _ = import_image(store, source, name=name)
    return image.digest


async def ready(gw: RunningGateway, name: str, image: str) -> pb.Sandbox:
    await gw.create(name=name, spec=pb.SandboxSpec(image=image))
    sandbox = await gw.wait_ready(name)
    assert sandbox.status.phase == pb.SANDBOX_PHASE_READY, sandbox
    return sandbox


async def sh(gw: RunningGateway, name: str, script: str) -> tuple[int, str, str]:
    code, out, err = await gw.exec(name, ["/bin/sh", "-c", script])
    return code, out.decode(), err.decode()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def test_a_sandbox_runs_on_its_image_with_a_writable_layer_of_its_own(state: Path, tmp_path: Path) -> None:
    digest = import_tiny(state, tmp_path / "tiny")
    layer = next((state / "images" / "layers" / "sha256").iterdir())
    before = {p.relative_to(layer): p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    async with running_gateway(state) as gw:
        first = await ready(gw, "one", "tiny:1")
        assert first.spec.image == f"tiny:1@{digest}"  # pinned: what it runs, whatever the tag names later
        assert await sh(gw, "one", "cat /etc/warmshell-test-marker") == (0, "built by the tests", "")
        assert (await sh(gw, "one", "[ -e /usr/bin/python3 ] || echo no-host-usr"))[1] == "no-host-usr\n"
        code, out, _ = await sh(gw, "one", "echo changed > /etc/warmshell-test-marker && mkdir -p /usr/lib/x && "
                                "echo new > /usr/lib/x/f && cat /etc/warmshell-test-marker /usr/lib/x/f")  # fmt: skip
        assert (code, out) == (0, "changed\nnew\n")
        await ready(gw, "two", f"sha256:{digest.removeprefix('sha256:')}")
        assert await sh(gw, "two", "cat /etc/warmshell-test-marker; ls /usr/lib/x >/dev/null 2>&1 || echo absent") == (
            0,
            "built by the testsabsent\n",
            "",
        )
        # Everything else is as for any sandbox: the agent is pid 1, /workspace and /tmp are there.
        code, out, _ = await sh(gw, "one", "cat /proc/1/comm; cd /workspace && : > w && cd /tmp && : > t && pwd")
        assert (code, out) == (0, "warmshell-agent\n/tmp\n")
    after = {p.relative_to(layer): p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    assert after == before  # nothing reached the store


async def test_an_unknown_image_is_refused_naming_the_field_and_how_to_import_it(state: Path) -> None:
    async with running_gateway(state) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.create(name="nope", spec=pb.SandboxSpec(image="python:3.12"))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert details.startswith("spec.image: "), details
        assert "warmshell image import" in details, details


async def test_the_upper_layer_is_bounded_by_local_root_size(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny")
    async with running_gateway(state, **{"local.root_size": "4Mi"}) as gw:
        await ready(gw, "small", "tiny:1")
        code, _, err = await sh(gw, "small", "head -c 8388608 /dev/zero > /etc/big")
        assert code != 0
        assert "No space left" in err, err
