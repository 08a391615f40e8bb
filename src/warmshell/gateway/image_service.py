"""The public ImageService: import, list, inspect, remove and prune the local driver's images.

Thin: it authenticates, receives an import's source into the store's staging area (bounded by
`local.image_store_size`), and runs the store's blocking work (`drivers.local.imagestore`) in a
worker thread, relaying its progress. A gateway on another driver has no store: every call is
FAILED_PRECONDITION saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from warmshell.api.v1 import image_pb2 as pb
from warmshell.api.v1 import image_pb2_grpc
from warmshell.core.config import GatewayConfig
from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore import importing, manifests, store
from warmshell.drivers.local.imagestore.records import ImageRecord, Index
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.calls import streaming, unary

__all__ = ["ImageService", "image_to_proto"]

Ctx = grpc.aio.ServicerContext[Any, Any]
# Disk writes of an upload are batched to this size (one worker-thread hop each, not one per message).
_WRITE_BATCH = 4 << 20
_REPORT_EVERY = 16 << 20


def image_to_proto(image: ImageRecord, index: Index) -> pb.Image:
    """The wire form of a stored image."""
    config = image.config
    layers = [index.layers[d] for d in image.layers if d in index.layers]
    return pb.Image(
        digest=image.digest,
        names=index.names_of(image.digest),
        config_digest=image.config_digest,
        platform=image.platform,
        created=config.created,
        imported_ms=image.imported_ms,
        size=index.image_size(image),
        layers=[
            pb.ImageLayer(digest=layer.digest, size=layer.size, entries=layer.entries, whiteouts=len(layer.whiteouts))
            for layer in layers
        ],
        config=pb.ImageRuntimeConfig(
            env=config.env,
            entrypoint=config.entrypoint,
            cmd=config.cmd,
            working_dir=config.working_dir,
            user=config.user,
            labels=config.labels,
        ),
        source_format=image.source_format,
        source_sandbox=image.source_sandbox,
        base_digest=image.base_digest,
    )


class ImageService(image_pb2_grpc.ImageServiceServicer):
    """gRPC handlers over one `ImageStore` (None: this gateway's driver has no image store)."""

    def __init__(self, image_store: store.ImageStore | None, auth: Authenticator) -> None:
        self._store = image_store
        self._auth = auth
        self._opened: asyncio.Lock | None = None
        self._open = False

    @classmethod
    def for_config(cls, config: GatewayConfig, auth: Authenticator) -> ImageService:
        """The service for a gateway: a store under `local.image_dir` (else the state directory's
        images/) on the local driver, none on another."""
        if config.driver != "local":
            return cls(None, auth)
        return cls(store.for_config(config.local, config.paths), auth)

    async def _ready(self, context: Ctx) -> store.ImageStore:
        await self._auth.require_client(context)
        if self._store is None:
            raise FailedPreconditionError(
                "this gateway's driver has no image store: images are imported on the local driver "
                "(a Kubernetes cluster pulls its images from a registry)"
            )
        if self._opened is None:
            self._opened = asyncio.Lock()
        async with self._opened:
            if not self._open:  # opened on first use: collecting an interrupted import's leftovers
                await asyncio.to_thread(self._store.open)
                self._open = True
        return self._store

    @streaming
    async def ImportImage(
        self, request_iterator: AsyncIterator[pb.ImportImageRequest], context: Ctx
    ) -> AsyncIterator[pb.ImportImageEvent]:
        image_store = await self._ready(context)
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("header"):
            raise InvalidArgumentError("header", "the first message of an import must be its header")
        header = first.header
        wanted = manifests.parse_platform(header.platform, field="platform") if header.platform else None
        # Under the store's staging/: on its filesystem, and removed by the next open after a crash.
        directory = await asyncio.to_thread(image_store.new_staging)
        try:
            upload = directory / "source.tar"
            async for event in _receive(request_iterator, upload, image_store.max_bytes, header.size):
                yield event
            async for event in _run_import(image_store, upload, header, wanted):
                yield event
        finally:
            await asyncio.to_thread(image_store.drop_staging, directory)

    @unary
    async def ListImages(self, request: pb.ListImagesRequest, context: Ctx) -> pb.ListImagesResponse:
        image_store = await self._ready(context)
        index = await asyncio.to_thread(image_store.index)
        images = sorted(index.images.values(), key=lambda i: (index.names_of(i.digest) or ["~"], i.digest))
        return pb.ListImagesResponse(
            images=[image_to_proto(i, index) for i in images],
            store_bytes=index.usage(),
            store_limit_bytes=image_store.max_bytes,
        )

    @unary
    async def GetImage(self, request: pb.ImageRef, context: Ctx) -> pb.Image:
        image_store = await self._ready(context)
        image = await asyncio.to_thread(image_store.resolve, request.ref, field="ref")
        return image_to_proto(image, await asyncio.to_thread(image_store.index))

    @unary
    async def RemoveImage(self, request: pb.ImageRef, context: Ctx) -> pb.RemoveImageResponse:
        image_store = await self._ready(context)
        return _removed(await asyncio.to_thread(image_store.remove, request.ref))

    @unary
    async def PruneImages(self, request: pb.PruneImagesRequest, context: Ctx) -> pb.RemoveImageResponse:
        image_store = await self._ready(context)
        return _removed(await asyncio.to_thread(image_store.prune))


def _removed(pruned: store.Pruned) -> pb.RemoveImageResponse:
    return pb.RemoveImageResponse(removed=pruned.images, layers_removed=pruned.layers, bytes_freed=pruned.bytes)


async def _receive(
    requests: AsyncIterator[pb.ImportImageRequest], path: Path, limit: int, size: int
) -> AsyncIterator[pb.ImportImageEvent]:
    """Write the source's chunks to `path`, refusing one larger than the whole store."""
    received, reported, pending = 0, 0, bytearray()
    handle = await asyncio.to_thread(path.open, "wb")
    try:
        async for message in requests:
            if message.HasField("header"):
                raise InvalidArgumentError("header", "only the first message of an import is a header")
            received += len(message.data)
            if received > limit:
                raise ResourceExhaustedError(
                    f"the image source is over the image store's {limit} bytes ({store.SIZE_KEY})"
                )
            pending += message.data
            if len(pending) >= _WRITE_BATCH:
                await asyncio.to_thread(handle.write, bytes(pending))
                pending.clear()
            if received - reported >= _REPORT_EVERY:
                reported = received
                yield pb.ImportImageEvent(
                    progress=pb.ImportProgress(stage="receiving", done_bytes=received, total_bytes=size)
                )
        await asyncio.to_thread(handle.write, bytes(pending))
    finally:
        await asyncio.to_thread(handle.close)


async def _run_import(
    image_store: store.ImageStore, upload: Path, header: pb.ImportImageHeader, wanted: manifests.Platform | None
) -> AsyncIterator[pb.ImportImageEvent]:
    """Import in a worker thread, yielding its progress and then the image."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[importing.Progress] = asyncio.Queue()

    def report(progress: importing.Progress) -> None:
        loop.call_soon_threadsafe(events.put_nowait, progress)

    work = asyncio.ensure_future(
        asyncio.to_thread(
            importing.import_image,
            image_store,
            upload,
            name=header.name,
            wanted=wanted,
            source_name=header.source_name or "the uploaded source",
            progress=report,
        )
    )
    # A client gone mid-import leaves the thread running (it cannot be interrupted): its result
    # stands, and it reads the upload through a descriptor it already holds.
    while not work.done() or not events.empty():
        getter = asyncio.ensure_future(events.get())
        await asyncio.wait({getter, work}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            continue
        p = getter.result()
        yield pb.ImportImageEvent(
            progress=pb.ImportProgress(
                stage="unpacking",
                done_bytes=p.bytes_done,
                total_bytes=p.bytes_total,
                layers_done=p.layers_done,
                layers=p.layers,
            )
        )
    image, _ = await work
    index = await asyncio.to_thread(image_store.index)
    yield pb.ImportImageEvent(image=image_to_proto(image, index))
