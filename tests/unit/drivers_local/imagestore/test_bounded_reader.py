"""The layer's counted stream reads ahead of the tar, and neither what the tar sees nor the bound
changes with it: any sequence of read sizes gives back the stream's bytes in order, the count
is the stream's length once drained, and a stream past the limit is refused."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import ResourceExhaustedError
from warmshell.drivers.local.imagestore.extracting import _CHUNK, BoundedReader

_SIZES = st.lists(st.one_of(st.integers(0, 2 * _CHUNK), st.sampled_from([-1, 512, 10240, _CHUNK])), max_size=12)


class _Trickle(io.BytesIO):
    """A stream that returns at most `most` bytes per read, as a decompressor may."""

    def __init__(self, data: bytes, most: int) -> None:
        super().__init__(data)
        self.most = most

    def read(self, n: int | None = -1, /) -> bytes:
        return super().read(self.most if n is None or n < 0 else min(n, self.most))


@given(st.binary(max_size=3 * _CHUNK // 1024).map(lambda b: b * 1024), _SIZES, st.integers(1, 2 * _CHUNK))
def test_reads_of_any_size_give_the_stream_in_order(data: bytes, sizes: list[int], most: int) -> None:
    reader = BoundedReader(_Trickle(data, most), limit=len(data), key="k", where="w")
    got = bytearray()
    for size in sizes:
        chunk = reader.read(size)
        assert size < 0 or len(chunk) <= size
        got += chunk
    while chunk := reader.read(10240):
        got += chunk
    assert bytes(got) == data
    reader.drain()
    assert reader.count == len(data)


def test_the_drain_counts_what_the_tar_left() -> None:
    reader = BoundedReader(io.BytesIO(bytes(3 * _CHUNK + 7)), limit=4 * _CHUNK, key="k", where="w")
    assert len(reader.read(512)) == 512
    reader.drain()
    assert reader.count == 3 * _CHUNK + 7


@pytest.mark.parametrize("size", [512, _CHUNK, -1])
def test_a_stream_past_the_limit_is_refused_naming_the_key(size: int) -> None:
    reader = BoundedReader(io.BytesIO(bytes(2 * _CHUNK)), limit=_CHUNK + 1, key="local.image_store_size", where="w")
    with pytest.raises(ResourceExhaustedError, match=r"local\.image_store_size"):
        _read_all(reader, size)


def _read_all(reader: BoundedReader, size: int) -> None:
    while reader.read(size):
        pass
