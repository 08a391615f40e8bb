"""`client.images`: import, list, inspect, remove and prune the gateway's images (the local
driver's image store), sync (`Images`) and async (`AsyncImages`), over the ImageService.

An import streams its source in chunks: an archive file as it is, a layout directory as a tar
written first to a temporary file (so memory stays flat whatever the image's size).
"""

from __future__ import annotations

import asyncio
import builtins
import os
import tarfile
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

from warmshell.api.v1 import image_pb2 as pb
from warmshell.sdk import errors
from warmshell.sdk.transport import Transport

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from grpc import aio

M = TypeVar("M", bound="Message")
Metadata = tuple[tuple[str, str], ...]
# Below the gateway's default max_request_bytes (1 MiB) with room for the message's framing.
CHUNK_BYTES = 256 * 1024
_PREFIX = "/warmshell.v1.ImageService/"

__all__ = ["AsyncImages", "ImageInfo", "Images", "ImportProgress", "LayerInfo"]


@dataclass(frozen=True)
class LayerInfo:
    """One layer: its uncompressed digest, bytes, entries and whiteouts."""

    digest: str
    size: int
    entries: int
    whiteouts: int


@dataclass(frozen=True)
class ImageInfo:
    """A stored image: its digest, tags, size, layers and runtime config."""

    digest: str
    names: list[str]
    size: int
    platform: str
    created: str
    imported_ms: int
    layers: list[LayerInfo]
    env: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    working_dir: str = ""
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    config_digest: str = ""

    @classmethod
    def from_proto(cls, image: pb.Image) -> ImageInfo:
        """From the wire form."""
        config = image.config
        return cls(
            digest=image.digest,
            names=list(image.names),
            size=image.size,
            platform=image.platform,
            created=image.created,
            imported_ms=image.imported_ms,
            layers=[LayerInfo(x.digest, x.size, x.entries, x.whiteouts) for x in image.layers],
            env=list(config.env),
            entrypoint=list(config.entrypoint),
            cmd=list(config.cmd),
            working_dir=config.working_dir,
            user=config.user,
            labels=dict(config.labels),
            config_digest=image.config_digest,
        )


@dataclass(frozen=True)
class ImportProgress:
    """Where an import is: `stage` is "sending", "receiving" or "unpacking"."""

    stage: str
    done_bytes: int
    total_bytes: int
    layers_done: int = 0
    layers: int = 0


Progress = Callable[[ImportProgress], None]


def _source_file(path: Path) -> IO[bytes]:
    """The bytes to send: the archive itself, or a layout directory tarred into a temporary file."""
    if not path.is_dir():
        return open(path, "rb")
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it
    with tarfile.open(fileobj=spool, mode="w") as tar:
        for entry in sorted(path.rglob("*")):
            tar.add(entry, arcname=str(entry.relative_to(path)), recursive=False)
    spool.seek(0)
    return spool


def _header(path: Path, size: int, name: str, platform: str) -> pb.ImportImageRequest:
    header = pb.ImportImageHeader(name=name, platform=platform, size=size, source_name=path.name)
    return pb.ImportImageRequest(header=header)


def _progress(event: pb.ImportImageEvent) -> ImportProgress:
    p = event.progress
    return ImportProgress(p.stage, p.done_bytes, p.total_bytes, p.layers_done, p.layers)


class _Base:
    def __init__(self, metadata: Metadata, address: str, timeout: float | None) -> None:
        self._metadata = metadata
        self._address = address
        self._timeout = timeout


class Images(_Base):
    """Sync image operations on one gateway: unary calls over the client's transport (the light
    HTTP/2 one included), the import's client stream over a grpcio channel."""

    def __init__(self, transport: Transport, *, metadata: Metadata = (), timeout: float | None = None) -> None:
        """`transport`: the client's; `metadata`: its authorization."""
        super().__init__(metadata, transport.address, timeout)
        self._transport = transport

    def _unary(self, method: str, request: Message, response_type: type[M]) -> M:
        return self._transport.unary(
            _PREFIX + method, request, response_type, metadata=self._metadata, timeout=self._timeout
        )

    def import_(
        self, path: str | os.PathLike[str], *, name: str = "", platform: str = "", progress: Progress | None = None
    ) -> ImageInfo:
        """Import an OCI layout directory, an OCI archive or a `docker save` tarball, tagged
        `name` (NAME[:TAG]; else the source's own tags); `platform` (OS/ARCH) picks one image
        of a multi-platform source. `progress` hears how far it is."""
        from warmshell.api.v1 import image_pb2_grpc

        stub = image_pb2_grpc.ImageServiceStub(self._transport.grpc_channel())
        source = Path(path)
        with _source_file(source) as handle:
            size = os.fstat(handle.fileno()).st_size

            def requests() -> Iterator[pb.ImportImageRequest]:
                yield _header(source, size, name, platform)
                sent = 0
                while chunk := handle.read(CHUNK_BYTES):
                    sent += len(chunk)
                    if progress is not None:
                        progress(ImportProgress("sending", sent, size))
                    yield pb.ImportImageRequest(data=chunk)

            with errors.translating(self._address):
                for event in stub.ImportImage(requests(), metadata=self._metadata):
                    if event.HasField("image"):
                        return ImageInfo.from_proto(event.image)
                    if progress is not None:
                        progress(_progress(event))
        raise RuntimeError("the gateway ended the import without its image")

    def list(self) -> builtins.list[ImageInfo]:
        """Every stored image, by name."""
        return [ImageInfo.from_proto(i) for i in self.list_response().images]

    def list_response(self) -> pb.ListImagesResponse:
        """ListImages as the wire gives it (the images and the store's usage and bound)."""
        return self._unary("ListImages", pb.ListImagesRequest(), pb.ListImagesResponse)

    def get(self, ref: str) -> ImageInfo:
        """The image `ref` names (NAME[:TAG], NAME@sha256:…, or a digest); NotFound if none."""
        return ImageInfo.from_proto(self.get_message(ref))

    def get_message(self, ref: str) -> pb.Image:
        """GetImage as the wire gives it."""
        return self._unary("GetImage", pb.ImageRef(ref=ref), pb.Image)

    def remove(self, ref: str) -> builtins.list[str]:
        """Untag NAME:TAG (the image goes with its last tag) or remove a digest's image; the
        digests of the images deleted."""
        return list(self._unary("RemoveImage", pb.ImageRef(ref=ref), pb.RemoveImageResponse).removed)

    def prune(self) -> builtins.list[str]:
        """Remove untagged images and unused layers; the digests of the images deleted."""
        return list(self._unary("PruneImages", pb.PruneImagesRequest(), pb.RemoveImageResponse).removed)


class AsyncImages(_Base):
    """The same operations, awaited."""

    def __init__(
        self,
        channel: aio.Channel,
        *,
        address: str,
        metadata: Metadata = (),
        timeout: float | None = None,
    ) -> None:
        """`channel`: the client's aio channel to the gateway at `address`; `metadata`: its authorization."""
        from warmshell.api.v1 import image_pb2_grpc

        super().__init__(metadata, address, timeout)
        self._stub = image_pb2_grpc.ImageServiceStub(channel)

    async def import_(
        self, path: str | os.PathLike[str], *, name: str = "", platform: str = "", progress: Progress | None = None
    ) -> ImageInfo:
        """As `Images.import_`."""
        source = Path(path)
        handle = await asyncio.to_thread(_source_file, source)
        try:
            size = os.fstat(handle.fileno()).st_size

            async def requests() -> AsyncIterator[pb.ImportImageRequest]:
                yield _header(source, size, name, platform)
                sent = 0
                while chunk := await asyncio.to_thread(handle.read, CHUNK_BYTES):
                    sent += len(chunk)
                    if progress is not None:
                        progress(ImportProgress("sending", sent, size))
                    yield pb.ImportImageRequest(data=chunk)

            with errors.translating(self._address):
                async for event in self._stub.ImportImage(requests(), metadata=self._metadata):
                    if event.HasField("image"):
                        return ImageInfo.from_proto(event.image)
                    if progress is not None:
                        progress(_progress(event))
        finally:
            handle.close()
        raise RuntimeError("the gateway ended the import without its image")

    async def list(self) -> list[ImageInfo]:
        """Every stored image, by name."""
        with errors.translating(self._address):
            response = await self._stub.ListImages(
                pb.ListImagesRequest(), metadata=self._metadata, timeout=self._timeout
            )
        return [ImageInfo.from_proto(i) for i in response.images]

    async def get(self, ref: str) -> ImageInfo:
        """As `Images.get`."""
        with errors.translating(self._address):
            image = await self._stub.GetImage(pb.ImageRef(ref=ref), metadata=self._metadata, timeout=self._timeout)
        return ImageInfo.from_proto(image)

    async def remove(self, ref: str) -> builtins.list[str]:
        """As `Images.remove`."""
        with errors.translating(self._address):
            response = await self._stub.RemoveImage(
                pb.ImageRef(ref=ref), metadata=self._metadata, timeout=self._timeout
            )
        return list(response.removed)

    async def prune(self) -> builtins.list[str]:
        """As `Images.prune`."""
        with errors.translating(self._address):
            response = await self._stub.PruneImages(
                pb.PruneImagesRequest(), metadata=self._metadata, timeout=self._timeout
            )
        return list(response.removed)
