"""Attacks through `spec.image` on the local driver: an image root is bound as the sandbox's `/`,
so naming a host directory as one would hand the workload whatever that directory holds (the
host's own root, homes, another gateway's state). Only directories below `local.image_roots`
are images; anything else, however it is spelt (`..`, a symlink inside an allowed root), is
refused before the driver looks at it, with one answer whether the path exists or not."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_local_cold import make_image
from tests.integration.security.support import sandbox
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = [needs_bwrap]


@pytest.fixture
def image_root() -> Iterator[Path]:
    # The sandbox's own uid resolves the image's path, so it lives where that uid can reach it.
    with tempfile.TemporaryDirectory(prefix="warmshell-images-") as base:
        os.chmod(base, 0o755)
        yield Path(base)


async def test_only_images_below_the_image_roots_are_accepted(tmp_path: Path, image_root: Path) -> None:
    image = make_image(image_root / "tiny")
    (image_root / "host").symlink_to("/")
    (image_root / "state").symlink_to(tmp_path)
    outside = make_image(tmp_path / "outside")
    async with running_gateway(tmp_path / "state", **{"local.image_roots": [str(image_root)]}) as gw:
        refusals = set()
        attempts = ["/", "/usr/..", "/home", "/no/such", str(image_root), f"{image_root}/../..", str(outside)]
        attempts += [f"{image_root}/host", f"{image_root}/state/state"]  # links inside the root, out of it
        for attempt in attempts:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gw.create(name="img", spec=pb.SandboxSpec(image=attempt))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = caught.value.details() or ""
            assert details.startswith("spec.image: "), details
            assert "local.image_roots" in details, details
            refusals.add(details.replace(repr(attempt), "IMAGE", 1))
        assert len(refusals) == 1, refusals  # the same answer for every path: nothing learnt of the host
        assert (await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)).sandboxes == []
        # The image below the root is one, and it is the sandbox's root.
        await sandbox(gw, "img", pb.SandboxSpec(image=str(image)))
        script = "[ -e /etc/image-marker ] && echo image; [ -e /usr/bin/dash ] || echo no-host-usr"
        assert await gw.exec("img", ["/usr/bin/sh", "-c", script]) == (0, b"image\nno-host-usr\n", b"")
