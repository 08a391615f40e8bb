"""The digest computed beside the reader: for any blocks, in any sizes around the size handed
to the worker, it is the sha256 of their concatenation; a buffer refilled after `wait()` is
hashed as it was when given; closing stops the worker."""

from __future__ import annotations

import hashlib
import io
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from warmshell.drivers.local.imagestore.digests import _BESIDE_MIN, StreamDigest
from warmshell.drivers.local.imagestore.sources import HashingReader

_SIZES = st.lists(st.sampled_from([0, 1, _BESIDE_MIN - 1, _BESIDE_MIN, 3 * _BESIDE_MIN + 5]), max_size=8)


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("warmshell-digest")]


@settings(max_examples=40, deadline=None)
@given(_SIZES, st.integers(0, 255))
def test_the_digest_is_that_of_the_blocks_in_order(sizes: list[int], seed: int) -> None:
    blocks = [bytes((seed + i + j) % 256 for j in range(size)) for i, size in enumerate(sizes)]
    digest = StreamDigest()
    try:
        for block in blocks:
            digest.update(block)
        assert digest.hexdigest() == hashlib.sha256(b"".join(blocks)).hexdigest()
    finally:
        digest.close()


def test_a_buffer_refilled_after_wait_is_hashed_as_it_was_given() -> None:
    buffer = bytearray(4 * _BESIDE_MIN)
    view = memoryview(buffer)
    expected = hashlib.sha256()
    digest = StreamDigest()
    try:
        for round_ in range(64):
            digest.wait()
            buffer[:] = bytes([round_]) * len(buffer)  # what a reader's refill does
            expected.update(buffer)
            digest.update(view)
        assert digest.hexdigest() == expected.hexdigest()
    finally:
        digest.close()


def test_closing_the_reader_stops_its_worker() -> None:
    data = bytes(range(256)) * (4 * _BESIDE_MIN // 256)
    buffer = memoryview(bytearray(2 * _BESIDE_MIN))
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with HashingReader(io.BytesIO(data), digest=digest, size=len(data), where="w") as reader:
        while reader.readinto(buffer):
            pass
        assert _workers()
        reader.verify()
    assert not _workers()
