"""The C tar reader against Python's `tarfile` on the same archives: the same entries (names,
kinds, modes, sizes, link targets) and the same file data, for each tar format, names in any
text (undecodable bytes included), and a source returning any amount per read; a broken stream is
InvalidArgumentError naming the layer, and a failure of the source itself comes out unchanged."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError, ResourceExhaustedError
from warmshell.drivers.local.imagestore.entries import Entry, Kind
from warmshell.drivers.local.imagestore.tarreading import Source, TarReader

_KINDS = {
    tarfile.REGTYPE: Kind.FILE,
    tarfile.DIRTYPE: Kind.DIRECTORY,
    tarfile.SYMTYPE: Kind.SYMLINK,
    tarfile.LNKTYPE: Kind.HARDLINK,
    tarfile.FIFOTYPE: Kind.FIFO,
    tarfile.CHRTYPE: Kind.DEVICE,
}
_NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"), min_size=1, max_size=120)


class _Trickle:
    """A source giving at most `most` bytes per read."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data = io.BytesIO(data)
        self.most = most

    def readinto(self, buffer: memoryview, /) -> int:
        data = self._data.read(min(len(buffer), self.most))
        buffer[: len(data)] = data
        return len(data)


@st.composite
def archives(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, Kind, int, int, str, bytes]]]:
    fmt = draw(st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
    buffer = io.BytesIO()
    expected = []
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for index in range(draw(st.integers(1, 8))):
            name = f"d{index}/" + draw(_NAMES)
            if fmt == tarfile.USTAR_FORMAT and len(name.encode(errors="surrogateescape")) > 99:
                name = f"d{index}/short"
            if draw(st.booleans()) and fmt != tarfile.PAX_FORMAT:
                name += "\udcff"  # a byte that is not UTF-8: kept as tarfile keeps it
            kind = draw(st.sampled_from(sorted(_KINDS, key=str)))
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = draw(st.integers(0, 0o7777))
            data = draw(st.binary(max_size=3000)) if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = draw(_NAMES) if fmt != tarfile.USTAR_FORMAT else "target"
            tar.addfile(info, io.BytesIO(data) if data else None)
            expected.append((name.rstrip("/"), _KINDS[kind], info.mode, len(data), info.linkname, data))
    return buffer.getvalue(), expected


@settings(max_examples=150, deadline=None)
@given(archives(), st.integers(1, 1 << 20))
def test_the_entries_and_data_are_what_tarfile_reads(
    archive: tuple[bytes, list[tuple[str, Kind, int, int, str, bytes]]], most: int
) -> None:
    data, expected = archive
    got = []
    read, write = os.pipe()
    try:
        with TarReader(_Trickle(data, most), where="layer") as tar:
            for member in tar:
                content = b""
                if member.size:
                    tar.copy_to(write)
                    content = os.read(read, member.size + 1)
                got.append((member.name.rstrip("/"), member.kind, member.mode, member.size, member.link, content))
    finally:
        os.close(read)
        os.close(write)
    assert got == expected


def _one_file(size: int = 2000) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("f")
        info.size = size
        tar.addfile(info, io.BytesIO(b"x" * size))
    return buffer.getvalue()


def _members(source: Source) -> list[Entry]:
    with TarReader(source, where="sha256:abc") as tar:
        return list(tar)


@pytest.mark.parametrize(
    "data",
    [b"", b"not a tar at all" * 64, _one_file()[:700]],
    ids=["empty", "not-a-tar", "truncated-header"],
)
def test_a_stream_that_is_no_tar_is_invalid_naming_the_layer(data: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="sha256:abc"):
        _members(_Trickle(data, 1 << 20))


def _copy_all(data: bytes) -> list[int]:
    """Each entry's size, once its data was copied out."""
    read, write = os.pipe()
    sizes = []
    try:
        with TarReader(_Trickle(data, 1 << 20), where="sha256:abc") as tar:
            for member in tar:
                tar.copy_to(write)
                sizes.append(member.size)
    finally:
        os.close(read)
        os.close(write)
    return sizes


def test_truncated_file_data_is_invalid_naming_the_layer() -> None:
    assert _copy_all(_one_file(4000)) == [4000]
    with pytest.raises(InvalidArgumentError, match="sha256:abc"):
        _copy_all(_one_file(4000)[:1500])


def test_a_failure_of_the_source_comes_out_as_the_source_raised_it() -> None:
    class Failing:
        def readinto(self, buffer: memoryview, /) -> int:
            raise ResourceExhaustedError("layer: unpacks to more than the bound")

    with pytest.raises(ResourceExhaustedError, match="more than the bound"):
        _members(Failing())
