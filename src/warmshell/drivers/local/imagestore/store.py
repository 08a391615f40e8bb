"""The image store on disk: `index.json` (tags, images, layers), `layers/sha256/HEX/` (each an
unpacked layer, an overlayfs lower directory), `staging/` (imports and removals in flight), and
`lock` (an flock: several threads, or two gateways sharing `local.image_dir`).

Crash safety comes from order: a layer is unpacked under `staging/` and renamed into `layers/`
when complete; an image becomes visible only when the index naming it (and its layers) is
written in one atomic rename. A durable commit (an import, a tagged snapshot, a pause: for a
pause the sandbox's only copy) forces the layers' data and directory entries to disk before that
index is written, so a power loss never leaves a synced index naming torn data; a fork's commit
is not durable (its layer carries the boot id; see `LayerRecord.boot_id`).
A removal writes the index first, then moves the layer into `staging/` and deletes it there.
Whatever a `kill -9` interrupts, the next `open()` deletes `staging/` and any layer directory the
index does not own.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from warmshell.core import quantities
from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import NotFoundError, ResourceExhaustedError
from warmshell.drivers.local.imagestore import references
from warmshell.drivers.local.imagestore.records import ImageRecord, Index, LayerRecord

__all__ = ["SIZE_KEY", "ImageStore", "Pruned", "StagedLayer", "boot_id", "for_config", "sync_filesystem"]

SIZE_KEY = "local.image_store_size"
_HOW_TO_IMPORT = "import it first: warmshell image import SOURCE --name NAME:TAG (see warmshell image list)"


@dataclass(frozen=True)
class StagedLayer:
    """A layer unpacked under staging, ready to be committed."""

    record: LayerRecord
    path: Path


@dataclass(frozen=True)
class Pruned:
    """What a prune (or a removal) deleted."""

    images: tuple[str, ...]
    layers: int
    bytes: int


def for_config(config: LocalDriverConfig, paths: StatePaths) -> ImageStore:
    """A gateway's store: under `local.image_dir`, else the state directory's images/ (not opened)."""
    limit = quantities.memory_bytes(config.image_store_size, field="local.image_store_size")
    return ImageStore(config.image_dir or paths.root / "images", max_bytes=limit)


class ImageStore:
    """The store under `root`, bounded to `max_bytes` of uncompressed layers. Blocking: the
    gateway calls it from a worker thread."""

    def __init__(self, root: Path, *, max_bytes: int, sync: Callable[[Path], None] | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        # Forces everything written under a path to disk: `sync_filesystem` (a test records it).
        self._sync = sync or sync_filesystem
        self._thread_lock = threading.Lock()
        # Each staging directory in use holds an flock on its `.lock` (name -> descriptor): a
        # store opened by another gateway sharing `local.image_dir` leaves it alone, and the
        # lock goes with a process that dies, so its directory is collected.
        self._in_flight: dict[str, int] = {}

    @property
    def index_file(self) -> Path:
        """The index (replaced whole, by a rename, at each change)."""
        return self.root / "index.json"

    @property
    def _staging(self) -> Path:
        return self.root / "staging"

    @property
    def _layers(self) -> Path:
        return self.root / "layers" / "sha256"

    def layer_path(self, digest: str) -> Path:
        """Where layer `digest` is unpacked (an overlayfs lower directory)."""
        return self._layers / digest.removeprefix("sha256:")

    def hold(self, digests: tuple[str, ...]) -> list[int]:
        """Keep these layers on disk while the returned descriptors are open (a shared flock on
        each layer's directory: a sandbox's root is mounted from them, and removing a layer under
        a live overlay breaks it). A removal or prune leaves a held layer out of the index's
        images but on disk and counted; the first one after `release` deletes it."""
        fds: list[int] = []
        try:
            for digest in digests:
                fds.append(os.open(self.layer_path(digest), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
                fcntl.flock(fds[-1], fcntl.LOCK_SH)
        except OSError:
            self.release(fds)
            raise
        return fds

    @staticmethod
    def release(fds: list[int]) -> None:
        """Let go of what `hold` returned."""
        for fd in fds:
            os.close(fd)

    def open(self) -> None:
        """Create the store if new, and delete what an interrupted import or removal left."""
        self._layers.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir(exist_ok=True)
        with self._locked():
            for leftover in self._staging.iterdir():
                if _abandoned(leftover):
                    _remove_tree(leftover)
            index = self._read()
            for stale in index.unsynced_from_other_boots(boot_id()):
                index.images.pop(stale)
                index.tags = {t: d for t, d in index.tags.items() if d != stale}
            kept = {d for d in index.layers if d in index.used_layers() or _held(self.layer_path(d))}
            index.layers = {d: layer for d, layer in index.layers.items() if d in kept}
            self._write(index)
            for directory in self._layers.iterdir():
                if f"sha256:{directory.name}" not in kept:
                    self._discard(directory)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock, open(self.root / "lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _read(self) -> Index:
        for path in (self.index_file, self._synced_index):
            try:
                return Index.from_json(json.loads(path.read_bytes()))
            except FileNotFoundError:
                continue
            except (ValueError, TypeError, KeyError):
                # Torn: an index written without syncing, cut by a power loss. The last synced
                # one lacks only what such a write added (a fork's image, which died with the host).
                if path == self._synced_index or not self._synced_index.exists():
                    raise
        return Index()

    @property
    def _synced_index(self) -> Path:
        """A second name for the last index forced to disk (see `_write`)."""
        return self.root / "index.synced.json"

    def _write(self, index: Index, *, sync: bool = True) -> None:
        """Replace the index. `sync`: forced to disk, and also named `index.synced.json`, which an
        unsynced write leaves alone, so a power loss that tears an unsynced index (its rename
        reached the disk, its data not) leaves the synced one to read (`_read`)."""
        temporary = self.root / f".index.{uuid.uuid4().hex}"
        with open(temporary, "w") as handle:
            json.dump(index.to_json(), handle, indent=1)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        if sync:
            second = self.root / f".synced.{uuid.uuid4().hex}"
            os.link(temporary, second)
            os.replace(second, self._synced_index)
        os.replace(temporary, self.index_file)
        if sync:
            _fsync_directory(self.root)

    def _discard(self, path: Path) -> None:
        """Move `path` into staging (so a crash never leaves half of it in place), then delete."""
        doomed = self._staging / f"rm-{uuid.uuid4().hex}"
        os.rename(path, doomed)
        _remove_tree(doomed)

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh directory under staging/, deleted on exit (what was committed has moved)."""
        path = self.new_staging()
        try:
            yield path
        finally:
            self.drop_staging(path)

    def new_staging(self) -> Path:
        """A fresh directory under staging/ (the next `open` deletes it if `drop_staging` never does)."""
        path = self._staging / f"import-{uuid.uuid4().hex}"
        path.mkdir(mode=0o700)
        fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._in_flight[path.name] = fd
        return path

    def drop_staging(self, path: Path) -> None:
        """Delete a directory `new_staging` made."""
        _remove_tree(path)
        fd = self._in_flight.pop(path.name, None)
        if fd is not None:
            os.close(fd)

    def index(self) -> Index:
        """A snapshot of the index."""
        with self._locked():
            return self._read()

    def usage(self) -> int:
        """Bytes of stored layers."""
        return self.index().usage()

    def check_room(self, more: int, *, what: str, used: int | None = None) -> None:
        """Refuse (RESOURCE_EXHAUSTED naming the key) if `more` bytes would not fit beside
        `used` (None: the usage now)."""
        _check_room(self.usage() if used is None else used, more, self.max_bytes, what)

    def commit(
        self, image: ImageRecord, layers: list[StagedLayer], tags: list[str], *, sync: bool = True
    ) -> ImageRecord:
        """Make `image` visible under `tags`, moving its staged layers in (a layer some other
        import stored meanwhile is kept once: the staged copy is dropped). `sync` (durable): the
        staged layers' data and entries, and any unsynced layer the image names, are forced to
        disk before the index naming them is, and the index is. `sync` False (an image whose new
        layers carry their `boot_id`, swept by an open in another boot): nothing is forced to
        disk, which spares a fork two fsyncs (6-16 ms on its path on a busy host)."""
        if sync:
            # Before the lock: writeback of a 200 MB layer takes ~100 ms, more when other work
            # on the filesystem has dirty data, and a fork's commit must not wait behind it.
            self._sync(self.root)
        with self._locked():
            index = self._read()
            new = [s for s in layers if s.record.digest not in index.layers]
            _check_room(index.usage(), sum(s.record.size for s in new), self.max_bytes, f"image {image.digest}")
            for staged in new:
                target = self.layer_path(staged.record.digest)
                if target.exists():  # an orphan of a crash not yet collected
                    self._discard(target)
                os.rename(staged.path, target)
                index.layers[staged.record.digest] = staged.record
            if sync:
                self._sync_layers(index, image.layers)
                _fsync_directory(self._layers)  # the renames just made
            index.images.setdefault(image.digest, image)
            for tag in tags:
                index.tags[tag] = image.digest
            self._write(index, sync=sync)
            return index.images[image.digest]

    def _sync_layers(self, index: Index, digests: tuple[str, ...]) -> None:
        """Force to disk the unsynced layers among `digests` (a pause or tagged snapshot of a
        fork's child names its parent's fork layer) and record them as synced in `index`. Again,
        under the lock: such a layer committed by another thread or gateway after `commit`'s
        first sync would otherwise be named unsynced (rare: only a fork's child names one)."""
        unsynced = [d for d in digests if d in index.layers and index.layers[d].boot_id]
        if unsynced:
            self._sync(self.root)
        for digest in unsynced:
            index.layers[digest] = dataclasses.replace(index.layers[digest], boot_id="")

    def resolve(self, text: str, *, field: str = "image", index: Index | None = None) -> ImageRecord:
        """The image a reference names (in `index`, a snapshot the caller read; None: the index
        now); NotFoundError saying how to import it."""
        ref = references.parse_reference(text, field=field)
        index = index if index is not None else self.index()
        digest = ref.digest or index.tags.get(ref.tagged)
        image = index.images.get(digest or "")
        if image is None:
            raise NotFoundError(f"no image {text!r} in the image store: {_HOW_TO_IMPORT}")
        return image

    def remove(self, text: str) -> Pruned:
        """Untag `NAME:TAG` (the image goes with its last tag), or remove the image a digest
        names with all its tags; then the layers no image uses."""
        ref = references.parse_reference(text, field="image")
        with self._locked():
            index = self._read()
            digest = index.tags.get(ref.tagged) if ref.tagged and not ref.digest else ref.digest
            if not digest or digest not in index.images:
                raise NotFoundError(f"no image {text!r} in the image store (warmshell image list shows them)")
            if ref.tagged and not ref.digest:
                del index.tags[ref.tagged]
            else:
                index.tags = {t: d for t, d in index.tags.items() if d != digest}
            removed = () if index.names_of(digest) else (digest,)
            for gone in removed:
                del index.images[gone]
            return self._collect(index, removed)

    def prune(self) -> Pruned:
        """Remove images no tag names, and layers no image uses."""
        with self._locked():
            index = self._read()
            tagged = set(index.tags.values())
            removed = tuple(sorted(d for d in index.images if d not in tagged))
            for digest in removed:
                del index.images[digest]
            return self._collect(index, removed)

    def _collect(self, index: Index, removed: tuple[str, ...]) -> Pruned:
        used = index.used_layers()
        unused = [index.layers.pop(d) for d in list(index.layers) if d not in used and not _held(self.layer_path(d))]
        self._write(index)  # first: from here on no image names these layers
        for layer in unused:
            if self.layer_path(layer.digest).exists():
                self._discard(self.layer_path(layer.digest))
        return Pruned(images=removed, layers=len(unused), bytes=sum(layer.size for layer in unused))


def _check_room(used: int, more: int, limit: int, what: str) -> None:
    if used + more > limit:
        raise ResourceExhaustedError(
            f"{what} needs {more} more bytes; the image store holds {used} of its {limit} ({SIZE_KEY}): "
            f"remove images (warmshell image rm, image prune) or raise {SIZE_KEY}"
        )


def _abandoned(path: Path) -> bool:
    """Whether no live process holds staging directory `path` (its `.lock` is free, or absent)."""
    return _locked_by_another(path / ".lock", os.O_RDWR) is not True


def _held(layer: Path) -> bool:
    """Whether some sandbox's root holds `layer` (see `ImageStore.hold`)."""
    return _locked_by_another(layer, os.O_RDONLY | os.O_DIRECTORY) is True


def _locked_by_another(path: Path, flags: int) -> bool | None:
    """Whether another open file holds an flock on `path` (None: it cannot be opened)."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _remove_tree(path: Path) -> None:
    # Layers keep their owner's write bit on every directory (entries.safe_mode), so a store
    # run by a normal user can always delete what it unpacked.
    shutil.rmtree(path, ignore_errors=True)


_LIBC = ctypes.CDLL(None, use_errno=True)


def sync_filesystem(path: Path) -> None:
    """Force to disk every write on the filesystem holding `path` (`syncfs`: one system call, the
    kernel's writeback of every dirty inode at once). On ext4, for the Debian layer's ~9,000
    files: ~230 ms of wall time and 3 ms of CPU, where an fsync of each took 2.6-17 s and ~1 s
    of CPU (each waits for a journal commit of its own), and writeback started on every file
    before those fsyncs still 1-2 s and ~370 ms; for a 200 MB pause all three take ~100 ms.
    It also flushes other work's writes on that filesystem, which is why `commit` calls it
    before taking the store's lock. A writeback error raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _LIBC.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs {path}: {os.strerror(code)}")
    finally:
        os.close(fd)


def _fsync_directory(path: Path) -> None:
    """Force `path`'s entries (renames, creations in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def boot_id() -> str:
    """This boot of the host's id (the kernel's random one, new at each boot)."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def now_ms() -> int:
    """Wall-clock milliseconds, for an image's import time."""
    return int(time.time() * 1000)
