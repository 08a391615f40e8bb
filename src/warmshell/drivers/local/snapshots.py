"""Snapshots of running local sandboxes: what a sandbox of an image wrote over it (its overlay's
upper layer) and its `/workspace`, frozen for the moment they are read, become an image of the
image store: the base image's layers plus one new layer, no copy of the base.

The order is the store's own: the layer is written under `staging/` (`capture`) and the image
appears with its tag in one index write (`ImageStore.commit`); a crash in between leaves only
a staging directory, which the next open deletes. A tagged snapshot's layer is named by its
content's digest; an untagged one's (a fork's, a pause's: known only by the image digest the call
returns) by a random digest, which spares the fork a hash of everything it copies (see `capture`).
The sandbox is thawed whatever happens, and a refusal (the store's bound, a tag in use) leaves it
as it was. Past `local.max_layers` the new layer is the whole merged root, the image one layer
(flattened).

Durability. A tagged snapshot and a pause must outlive the host's power: their index write is
forced to disk (their new layer's data is left to the kernel's writeback, as an imported layer's
is). A fork's children die with the host, so its image need only last this boot: it is committed
without syncing (two fsyncs, 6-16 ms, off the fork's path) and its layer carries the host's
`boot_id`. The rules that keep the index from naming torn data: the store's first open after a
reboot removes every image naming a layer of another boot (and the layer); an unsynced index torn
by a power loss is never read (the store falls back to the last synced one, `ImageStore._read`,
which does not name the fork's image); and a synced commit of an image naming such a layer (a
snapshot or pause of a fork's child) forces that layer's data to disk first and clears its mark.

A sandbox of the host's root filesystem (no image) has no image to build on: its snapshot is
refused, saying to create it from an image.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from warmshell.core.errors import AlreadyExistsError, FailedPreconditionError
from warmshell.drivers.local.imagestore import references
from warmshell.drivers.local.imagestore.capture import Tree, capture_layer, tree_bytes
from warmshell.drivers.local.imagestore.derived import snapshot_record
from warmshell.drivers.local.imagestore.records import ImageRecord, LayerRecord
from warmshell.drivers.local.imagestore.store import ImageStore, StagedLayer, boot_id, now_ms
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.runtime.processes import SandboxProcess
from warmshell.drivers.local.runtime.sandboxing import WORKSPACE

__all__ = ["Snapshot", "Snapshots"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_ENTRIES = 1_000_000


@dataclass(frozen=True)
class Snapshot:
    """A snapshot taken: the image, its tag, the layer it added and how long the sandbox was frozen."""

    image: ImageRecord
    tag: str
    layer_bytes: int
    frozen_ms: int
    flattened: bool


class Snapshots:
    """Takes snapshots into `store`; `overlay_dirs(pid)` finds a sandbox's upper layer and merged
    root from its launcher's pid; `freeze(instance, frozen)` freezes or thaws a sandbox."""

    def __init__(
        self,
        store: ImageStore,
        *,
        overlay_dirs: Callable[[int], tuple[Path, Path] | None],
        freeze: Callable[[Instance, bool], Awaitable[None]],
        max_layers: int,
    ) -> None:
        self._store = store
        self._overlay_dirs = overlay_dirs
        self._freeze = freeze
        self._max_layers = max_layers
        self._boot_id = boot_id()

    async def take(self, instance: Instance, *, tag: str, force: bool, source: str, durable: bool = True) -> Snapshot:
        """Snapshot `instance` (running, of an image) as `tag`: AlreadyExistsError when the tag
        names an image and not `force`; RESOURCE_EXHAUSTED past the store's bound. `durable`
        False and no tag (a fork's): committed unsynced, good for this boot of the host only."""
        tagged = references.parse_tagged_name(tag, field="image").tagged if tag else ""
        image_root, process = instance.image_root, instance.process
        if image_root is None or not isinstance(process, SandboxProcess):
            raise FailedPreconditionError(
                f"sandbox {source} runs on the host's root filesystem, not an image: only a sandbox "
                "of an image can be snapshotted (create it with --image; warmshell image list)"
            )
        dirs = self._overlay_dirs(process.pid)
        if dirs is None:
            raise FailedPreconditionError(f"sandbox {source}: this gateway mounts no image roots")
        base, stage = await asyncio.to_thread(self._begin, tagged, force, image_root.digest)
        flatten = len(base.layers) + 1 > self._max_layers
        try:
            await self._freeze(instance, True)
            started = time.monotonic()
            try:
                layer = await asyncio.to_thread(
                    self._capture,
                    process,
                    dirs,
                    stage,
                    flatten=flatten,
                    workspace=not image_root.workspace,
                    source=source,
                    content=bool(tagged),
                )
            finally:
                frozen_ms = int((time.monotonic() - started) * 1000)
                await self._freeze(instance, False)
        except BaseException:
            await asyncio.to_thread(self._store.drop_staging, stage)
            raise
        image = snapshot_record(base, layer.digest, flattened=flatten, source_sandbox=source, now_ms=now_ms())
        ephemeral = not durable and not tagged
        if ephemeral:
            layer = dataclasses.replace(layer, boot_id=self._boot_id)
        # One thread hop for both (a hop costs milliseconds on a busy host, on a fork's path).
        staged = StagedLayer(layer, stage / "layer")
        committed = await asyncio.to_thread(self._commit, image, staged, tagged, not ephemeral)
        return Snapshot(committed, tagged, layer.size, frozen_ms, flatten)

    def _begin(self, tagged: str, force: bool, digest: str) -> tuple[ImageRecord, Path]:
        """Blocking: the base image, and a new staging directory once the tag is known free."""
        index = self._store.index()
        if tagged and tagged in index.tags and not force:
            raise AlreadyExistsError(f"image: {tagged} already names an image; --force moves the tag")
        return self._store.resolve(digest, index=index), self._store.new_staging()

    def _commit(self, image: ImageRecord, layer: StagedLayer, tagged: str, sync: bool) -> ImageRecord:
        """Blocking: commit the image, then delete its staging directory (whatever happens)."""
        try:
            return self._store.commit(image, [layer], [tagged] if tagged else [], sync=sync)
        finally:
            self._store.drop_staging(layer.path.parent)

    def _capture(
        self,
        process: SandboxProcess,
        dirs: tuple[Path, Path],
        stage: Path,
        *,
        flatten: bool,
        workspace: bool,
        source: str,
        content: bool,
    ) -> LayerRecord:
        """Blocking: the new layer, unpacked at `stage`/layer (the caller commits it), named by
        its content's digest, or (`content` False: an untagged snapshot) by a random one."""
        fds = [os.open(dirs[1] if flatten else dirs[0], _DIR_FLAGS)]
        try:
            trees = [Tree(fds[0], upper=not flatten)]
            if workspace:
                root = process.open_root()
                try:
                    fds.append(os.open(WORKSPACE.lstrip("/"), _DIR_FLAGS, dir_fd=root))
                finally:
                    os.close(root)
                trees.append(Tree(fds[1], prefix=WORKSPACE))
            what = f"the snapshot of {source}"
            self._store.check_room(tree_bytes(trees), what=what)
            budget = self._store.max_bytes - self._store.usage()
            return capture_layer(
                trees, stage / "layer", budget=budget, where=what, max_entries=_MAX_ENTRIES, content=content
            )
        finally:
            for fd in fds:
                os.close(fd)
