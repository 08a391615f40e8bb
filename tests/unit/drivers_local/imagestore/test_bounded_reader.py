"""The layer's counted stream fills the tar reader's buffer from a stream that can fill one
itself, or that can only `read` (a pipe): any sequence of buffer sizes gives back the stream's
bytes in order, the count is the stream's length once drained, and a stream past the limit is
refused naming the key."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore.extracting import _CHUNK, BoundedReader

_SIZES = st.lists(st.one_of(st.integers(1, 2 * _CHUNK), st.sampled_from([512, 10240, _CHUNK])), max_size=12)


class _Trickle:
    """A stream that can only `read`, and returns at most `most` bytes per read (a pipe)."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data = io.BytesIO(data)
        self.most = most

    def read(self, n: int = -1, /) -> bytes:
        return self._data.read(self.most if n < 0 else min(n, self.most))


class _TrickleInto(_Trickle):
    """The same stream, also filling a caller's buffer (a file, a decompressor)."""

    def readinto(self, buffer: memoryview, /) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@given(
    st.binary(max_size=3 * _CHUNK // 1024).map(lambda b: b * 1024),
    _SIZES,
    st.integers(1, 2 * _CHUNK),
    st.sampled_from([_Trickle, _TrickleInto]),
)
def test_fills_of_any_size_give_the_stream_in_order(
    data: bytes, sizes: list[int], most: int, kind: type[_Trickle]
) -> None:
    reader = BoundedReader(kind(data, most), limit=len(data), key="k", where="w")
    got = bytearray()
    for size in [*sizes, _CHUNK]:
        buffer = memoryview(bytearray(size))
        while n := reader.readinto(buffer):
            assert n <= size
            got += buffer[:n]
            if size != _CHUNK:
                break
    assert bytes(got) == data
    reader.drain()
    assert reader.count == len(data)


def test_the_drain_counts_what_the_tar_left() -> None:
    reader = BoundedReader(io.BytesIO(bytes(3 * _CHUNK + 7)), limit=4 * _CHUNK, key="k", where="w")
    assert reader.readinto(memoryview(bytearray(512))) == 512
    reader.drain()
    assert reader.count == 3 * _CHUNK + 7


@pytest.mark.parametrize("kind", [_Trickle, _TrickleInto])
@pytest.mark.parametrize("size", [512, _CHUNK, 3 * _CHUNK])
def test_a_stream_past_the_limit_is_refused_naming_the_key(size: int, kind: type[_Trickle]) -> None:
    reader = BoundedReader(kind(bytes(2 * _CHUNK), 1 << 30), limit=_CHUNK + 1, key="local.image_store_size", where="w")
    with pytest.raises(ResourceExhaustedError, match=r"local\.image_store_size"):
        _read_all(reader, size)


def _read_all(reader: BoundedReader, size: int) -> None:
    buffer = memoryview(bytearray(size))
    while reader.readinto(buffer):
        pass


def test_a_broken_stream_is_invalid_naming_the_layer() -> None:
    class Broken:
        def read(self, n: int = -1, /) -> bytes:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    reader = BoundedReader(Broken(), limit=1 << 20, key="k", where="sha256:abc")
    with pytest.raises(InvalidArgumentError, match=r"sha256:abc.*truncated or corrupt"):
        reader.readinto(memoryview(bytearray(512)))
