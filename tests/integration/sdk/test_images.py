"""`client.images` on the sync client (both transports) and the async one, against a real
gateway process: import with progress, list, get, remove, prune; errors are SDK exceptions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers import images
from tests.helpers.cli import CliGateway, start_gateway
from tests.helpers.images import Layer
from warmshell.sdk.images import ImportProgress


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliGateway]:
    running = start_gateway(tmp_path_factory.mktemp("sdk-images") / "state")
    try:
        yield running
    finally:
        assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    base = images.host_shell_layer().tar()
    images.write_oci_layout(root, [base, Layer().file("etc/motd", b"hi").tar()])
    return root


@pytest.mark.parametrize("transport", ["grpcio", "http2"])
def test_the_sync_client_manages_images(gateway: CliGateway, layout: Path, transport: str) -> None:
    seen: list[ImportProgress] = []
    with warmshell.Client(state_dir=gateway.state_dir, transport=transport) as client:
        image = client.images.import_(layout, name=f"sdk/{transport}:1", progress=seen.append)
        assert image.names == [f"sdk/{transport}:1"]
        assert image.cmd == ["/bin/sh"]
        assert [p.stage for p in seen][-1] == "unpacking"
        assert seen[-1].layers_done == seen[-1].layers == 2
        assert client.images.get(f"sdk/{transport}:1").digest == image.digest
        assert image.digest in {i.digest for i in client.images.list()}
        assert client.images.remove(f"sdk/{transport}:1") == [image.digest]
        with pytest.raises(warmshell.NotFound, match="warmshell image import"):
            client.images.get(f"sdk/{transport}:1")
        with pytest.raises(warmshell.InvalidArgument, match="ref"):
            client.images.get("Not A Name")
        assert client.images.prune() == []


def test_the_async_client_manages_images(gateway: CliGateway, layout: Path, tmp_path: Path) -> None:
    images.write_docker_save(tmp_path / "save.tar", [images.host_shell_layer().tar()], repo_tags=["sdk/async:1"])

    async def scenario() -> None:
        async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
            image = await client.images.import_(tmp_path / "save.tar")
            assert image.names == ["sdk/async:1"]
            assert (await client.images.get("sdk/async:1")).layers == image.layers
            assert [i.digest for i in await client.images.list()] == [image.digest]
            assert await client.images.remove(image.digest) == [image.digest]
            with pytest.raises(warmshell.NotFound):
                await client.images.remove("sdk/async:1")
            assert await client.images.prune() == []

    asyncio.run(scenario())


def test_images_need_the_api_token(gateway: CliGateway, layout: Path) -> None:
    with warmshell.Client(state_dir=gateway.state_dir, token="not-the-token") as client:
        with pytest.raises(warmshell.Unauthenticated):
            client.images.list()
        with pytest.raises(warmshell.Unauthenticated):
            client.images.import_(layout, name="sdk/denied:1")
