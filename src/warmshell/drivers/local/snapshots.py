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

Durability. A tagged snapshot and a pause must outlive the host's power: their new layer, then the
index naming it, are forced to disk (`ImageStore.commit`), as an imported layer is. A fork's
children die with the host, so its image need only last this boot: it is committed without syncing
(two fsyncs, 6-16 ms, off the fork's path) and its layer carries the host's `boot_id`. The rules
that keep the index from naming torn data: the store's first open after a reboot removes every
image naming a layer of another boot (and the layer); an unsynced index torn by a power loss is
never read (the store falls back to the last synced one, `ImageStore._read`, which does not name
the fork's image); and a synced commit of an image naming such a layer (a snapshot or pause of a
fork's child) forces that layer's data to disk first and clears its mark.

A fork's layer is written into the store like any other, although a tmpfs would match its lifetime
(this boot): a tmpfs of 4 KiB pages costs more to fill than ext4's page cache of large folios, and
more to free (a fork of ten children of a 200 MB parent: ~180 against ~130 ms of the gateway's
CPU, and ~34 against ~13 ms for the prune that deletes the layer). One mounted `huge=within_size`
copies 200 MB in ~35 ms once its huge pages are warm, but each fork's layer takes fresh ones:
~500 ms of the gateway's CPU for that fork on a 2-core VM.

A fork's layer is always a copy, never the parent's own files: a hard link to a file of the
parent's tmpfs is the same inode (a tmpfs has no copy-on-write), so the parent's in-place writes,
appends and shared mappings after the snapshot would reach its children; handing the parent fresh
copies instead and the children its inodes leaves every descriptor and mapping the parent's
processes hold writing into the children's layer, and copies as many bytes. This copy of 200 MB
(`capture`'s: `fallocate`, then `splice` through a 1 MiB pipe) costs ~34 ms of CPU on a 2-core VM
at load 6, ~57 at load 14, the cheapest of the ways measured (`bench/investigations/fork-copy`).

A sandbox of the host's root filesystem (no image) has no image to build on: its snapshot is
refused, saying to create it from an image.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
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
    root from its launcher's pid; `freeze(instance, frozen)` freezes or thaws a sandbox (blocking)."""

    def __init__(
        self,
        store: ImageStore,
        *,
        overlay_dirs: Callable[[int], tuple[Path, Path] | None],
        freeze: Callable[[Instance, bool], None],
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
        # One thread hop for the whole snapshot, freeze and thaw included: a hop costs
        # milliseconds on a busy host, on a fork's path, and one between the freeze and the thaw
        # is time the sandbox stands still. A call cancelled meanwhile still ends it (committed,
        # or nothing kept), never with the thread writing into a staging directory being deleted.
        ephemeral = not durable and not tagged
        job = _Job(instance, process, dirs, image_root.digest, not image_root.workspace, tagged, source)
        return await asyncio.to_thread(self._take, job, force=force, ephemeral=ephemeral)

    def _take(self, job: _Job, *, force: bool, ephemeral: bool) -> Snapshot:
        """Blocking: the snapshot, committed; its staging directory deleted whatever happens."""
        base, used, stage = self._begin(job.tagged, force, job.base_digest)
        try:
            flatten = len(base.layers) + 1 > self._max_layers
            layer, frozen_ms = self._capture_frozen(job, stage, used=used, flatten=flatten)
            image = snapshot_record(base, layer.digest, flattened=flatten, source_sandbox=job.source, now_ms=now_ms())
            if ephemeral:
                layer = dataclasses.replace(layer, boot_id=self._boot_id)
            staged = StagedLayer(layer, stage / "layer")
            tags = [job.tagged] if job.tagged else []
            committed = self._store.commit(image, [staged], tags, sync=not ephemeral)
        finally:
            self._store.drop_staging(stage)
        return Snapshot(committed, job.tagged, layer.size, frozen_ms, flatten)

    def _begin(self, tagged: str, force: bool, digest: str) -> tuple[ImageRecord, int, Path]:
        """Blocking: the base image, the store's usage, and a new staging directory once the tag
        is known free. The usage is read here, before the freeze, not during it: the commit
        checks the bound again under the store's lock, so an import meanwhile still counts."""
        index = self._store.index()
        if tagged and tagged in index.tags and not force:
            raise AlreadyExistsError(f"image: {tagged} already names an image; --force moves the tag")
        return self._store.resolve(digest, index=index), index.usage(), self._store.new_staging()

    def _capture_frozen(self, job: _Job, stage: Path, *, used: int, flatten: bool) -> tuple[LayerRecord, int]:
        """Blocking: the layer captured while the sandbox is frozen, and how long it was (ms);
        thawed whatever happens."""
        self._freeze(job.instance, True)
        started = time.monotonic()
        try:
            layer = self._capture(job, stage, used=used, flatten=flatten)
        finally:
            frozen_ms = int((time.monotonic() - started) * 1000)
            self._freeze(job.instance, False)
        return layer, frozen_ms

    def _capture(self, job: _Job, stage: Path, *, used: int, flatten: bool) -> LayerRecord:
        """Blocking: the new layer, unpacked at `stage`/layer (the caller commits it), named by
        its content's digest, or (an untagged snapshot) by a random one."""
        fds = [os.open(job.dirs[1] if flatten else job.dirs[0], _DIR_FLAGS)]
        try:
            trees = [Tree(fds[0], upper=not flatten)]
            if job.workspace:
                root = job.process.open_root()
                try:
                    fds.append(os.open(WORKSPACE.lstrip("/"), _DIR_FLAGS, dir_fd=root))
                finally:
                    os.close(root)
                trees.append(Tree(fds[1], prefix=WORKSPACE))
            what = f"the snapshot of {job.source}"
            self._store.check_room(tree_bytes(trees), what=what, used=used)
            budget = self._store.max_bytes - used
            return capture_layer(
                trees, stage / "layer", budget=budget, where=what, max_entries=_MAX_ENTRIES, content=bool(job.tagged)
            )
        finally:
            for fd in fds:
                os.close(fd)


@dataclass(frozen=True)
class _Job:
    """What one snapshot takes: the sandbox, its launcher, its upper layer and merged root, its
    base image, whether its /workspace is a tree of its own to capture, the tag, and its name."""

    instance: Instance
    process: SandboxProcess
    dirs: tuple[Path, Path]
    base_digest: str
    workspace: bool
    tagged: str
    source: str
