"""The ImageService on a real grpc.aio server: an import streamed in chunks answers with progress
and the image; a bad first message, an upload over the store's bound and a gateway without a
store are refused with the status and the field or key they break."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers import images
from tests.helpers.grpc import serve_for
from tests.helpers.images import Layer
from warmshell.api.v1 import image_pb2 as pb
from warmshell.api.v1 import image_pb2_grpc
from warmshell.core.config import GatewayConfig
from warmshell.drivers.local.imagestore.store import ImageStore
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.image_service import ImageService

TOKEN = (("authorization", "Bearer api"),)


def _auth() -> Authenticator:
    return Authenticator(api_token="api", issuer=None, identity=None)  # type: ignore[arg-type]


async def _requests(header: pb.ImportImageHeader | None, data: bytes) -> AsyncIterator[pb.ImportImageRequest]:
    if header is not None:
        yield pb.ImportImageRequest(header=header)
    for start in range(0, len(data), 64 << 10):
        yield pb.ImportImageRequest(data=data[start : start + (64 << 10)])


@pytest.fixture
def archive(tmp_path: Path) -> bytes:
    images.write_oci_layout(tmp_path / "layout", [Layer().file("a", b"a" * 1000).tar(), Layer().file("b").tar()])
    images.tar_directory(tmp_path / "layout", tmp_path / "oci.tar")
    return (tmp_path / "oci.tar").read_bytes()


async def test_an_import_streams_progress_then_the_image(tmp_path: Path, archive: bytes) -> None:
    service = ImageService(ImageStore(tmp_path / "store", max_bytes=1 << 30), _auth())
    async with serve_for(service) as served:
        stub = image_pb2_grpc.ImageServiceStub(served.channel)
        header = pb.ImportImageHeader(name="unit/app:1", size=len(archive))
        events = [e async for e in stub.ImportImage(_requests(header, archive), metadata=TOKEN)]
        assert [e.progress.layers_done for e in events[:-1]] == [1, 2]
        assert events[-1].image.names == ["unit/app:1"]
        listed = await stub.ListImages(pb.ListImagesRequest(), metadata=TOKEN)
        assert [i.digest for i in listed.images] == [events[-1].image.digest]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetImage(pb.ImageRef(ref="unit/app:1"))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_an_import_must_start_with_its_header(tmp_path: Path, archive: bytes) -> None:
    service = ImageService(ImageStore(tmp_path / "store", max_bytes=1 << 30), _auth())
    async with serve_for(service) as served:
        stub = image_pb2_grpc.ImageServiceStub(served.channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [e async for e in stub.ImportImage(_requests(None, archive), metadata=TOKEN)]
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith("header:")


async def test_an_upload_over_the_store_bound_is_refused(tmp_path: Path, archive: bytes) -> None:
    store = ImageStore(tmp_path / "store", max_bytes=len(archive) - 1)
    async with serve_for(ImageService(store, _auth())) as served:
        stub = image_pb2_grpc.ImageServiceStub(served.channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [e async for e in stub.ImportImage(_requests(pb.ImportImageHeader(), archive), metadata=TOKEN)]
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "local.image_store_size" in caught.value.details()
    assert list((tmp_path / "store" / "staging").iterdir()) == []


async def test_a_gateway_on_another_driver_has_no_store(tmp_path: Path) -> None:
    config = GatewayConfig(state_dir=tmp_path, driver="kubernetes")
    async with serve_for(ImageService.for_config(config, _auth())) as served:
        stub = image_pb2_grpc.ImageServiceStub(served.channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListImages(pb.ListImagesRequest(), metadata=TOKEN)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "registry" in caught.value.details()
