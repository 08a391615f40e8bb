"""The sha256 of a layer as it streams, computed beside the unpacking rather than inside it.

A layer's tar is hashed and unpacked block by block; hashing a 170 MB Debian root is ~0.1 s of
CPU, a quarter of the import. `hashlib` releases the GIL while it hashes a large block, so a
worker thread hashes block n while libarchive writes block n's files: on a host with a spare
core the import takes the time of the unpacking alone. The CPU spent is the same.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["StreamDigest"]

# Blocks below this are hashed at once: handing one to the worker costs ~20 us, what hashing
# ~40 KiB costs (a gzip stream is read 8 KiB at a time).
_BESIDE_MIN = 64 * 1024


class StreamDigest:
    """The sha256 of the blocks given to `update`, in order.

    A block given to `update` is read after `update` returns: it must stay unchanged until the
    digest's next call. Call `wait()` before refilling a buffer that was given; `update`,
    `hexdigest` and `close` wait themselves."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def update(self, block: bytes | memoryview) -> None:
        """Add `block` (hashed on the worker when it is large)."""
        self.wait()
        if len(block) < _BESIDE_MIN:
            self._hash.update(block)
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warmshell-digest")
        self._pending = self._worker.submit(self._hash.update, block)

    def wait(self) -> None:
        """Return once every block given so far is hashed (the last one's buffer is free again)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def hexdigest(self) -> str:
        """The digest of every block given, in hex."""
        self.wait()
        return self._hash.hexdigest()

    def close(self) -> None:
        """Stop the worker (after the block it is hashing, if any). Idempotent."""
        worker, self._worker = self._worker, None
        self._pending = None
        if worker is not None:
            worker.shutdown(wait=True)
