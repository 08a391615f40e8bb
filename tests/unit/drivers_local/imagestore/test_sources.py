"""A member of an archive source is read at its offset in the archive: in any sizes, by `read` or
by filling a buffer, it gives the member's bytes and no byte of the next member; an archive cut
inside the member while it is read is truncated, naming the blob."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError
from warmshell.drivers.local.imagestore.sources import HashingReader, TarSource


def _archive(path: Path, members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=5000), st.lists(st.integers(1, 3000), min_size=1, max_size=6), st.booleans())
def test_a_member_reads_as_its_bytes_in_any_sizes(tmp_path: Path, data: bytes, sizes: list[int], into: bool) -> None:
    path = tmp_path / "source.tar"
    _archive(path, {"before": b"b" * 700, "layer.tar": data, "after": b"a" * 900})
    source = TarSource(path)
    try:
        got = bytearray()
        with source.open("layer.tar") as blob:
            for size in sizes * (len(data) // min(sizes) + 2):
                if into:
                    buffer = memoryview(bytearray(size))
                    n = blob.readinto(buffer)
                    got += buffer[:n]
                else:
                    got += blob.read(size)
        assert bytes(got) == data
    finally:
        source.close()


def test_an_archive_cut_inside_the_member_while_read_is_truncated_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "source.tar"
    _archive(path, {"manifest.json": b"[]", "layer.tar": bytes(64 * 1024)})
    source = TarSource(path)  # a whole archive when opened (a cut one is refused there)...
    try:
        with open(path, "r+b") as handle:  # ...then cut inside the layer: 20 KiB of its 64 are left
            handle.truncate(512 + 512 + 512 + 20 * 1024)
        blob = HashingReader(source.open("layer.tar"), digest="sha256:x", size=None, where="layer.tar (sha256:x)")
        with blob, pytest.raises(InvalidArgumentError, match=r"layer\.tar \(sha256:x\).*truncated"):
            _drain_into(blob)
    finally:
        source.close()


def _drain_into(blob: HashingReader) -> None:
    buffer = memoryview(bytearray(1 << 20))
    while blob.readinto(buffer):
        pass
