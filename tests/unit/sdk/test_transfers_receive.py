"""`transfers.download_whole` against a scripted byte stream on a real Unix socket: the status
line however it is split, the bytes after it received whole, and a stream cut short or refused."""

from __future__ import annotations

import io
import itertools
import socket
import tarfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import warmshell
from warmshell.core.transfers import HELLO_BYTES, PREFACE, TICKET_BYTES, Status, encode_status
from warmshell.sdk import transfers

TICKET = b"t" * TICKET_BYTES


def _serve(path: Path, pieces: list[bytes]) -> threading.Thread:
    """A listener that takes one hello and sends `pieces`, each in a send of its own, then closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def run() -> None:
        with listener, listener.accept()[0] as conn:
            hello = b""
            while len(hello) < HELLO_BYTES:
                hello += conn.recv(HELLO_BYTES - len(hello))
            assert hello == PREFACE + TICKET
            for piece in pieces:
                conn.sendall(piece)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def where(tmp_path: Path) -> transfers.Endpoint:
    return transfers.Endpoint(socket.AF_UNIX, str(tmp_path / "files.sock"), TICKET, "unix://gw")


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@settings(max_examples=30, deadline=None)
@given(body=st.binary(max_size=70_000), cuts=st.lists(st.integers(min_value=0), max_size=4))
def test_the_bytes_come_whole_however_the_stream_is_split(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, cuts: list[int]
) -> None:
    path = tmp_path_factory.mktemp("s") / "files.sock"
    wire = encode_status(Status(ok=True, size=len(body))) + body
    thread = _serve(path, _split(wire, cuts))
    assert transfers.download_whole(transfers.Endpoint(socket.AF_UNIX, str(path), TICKET, "gw")) == body
    thread.join(5)


def test_a_stream_cut_short_is_unavailable_and_a_refusal_is_its_error(where: transfers.Endpoint) -> None:
    thread = _serve(Path(str(where.address)), [encode_status(Status(ok=True, size=10)), b"12345"])
    with pytest.raises(warmshell.Unavailable, match="ended after 5 of 10 bytes"):
        transfers.download_whole(where)
    thread.join(5)
    Path(str(where.address)).unlink()
    thread = _serve(Path(str(where.address)), [encode_status(Status(ok=False, code="NOT_FOUND", message="/x: gone"))])
    with pytest.raises(warmshell.NotFound, match="/x: gone"):
        transfers.download_whole(where)
    thread.join(5)


def test_a_stream_that_cannot_be_reached_is_unreachable(where: transfers.Endpoint) -> None:
    with pytest.raises(transfers.Unreachable):
        transfers.download_whole(where)


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _framed(data: bytes, frame: int) -> list[bytes]:
    frames = [len(data[i : i + frame]).to_bytes(8, "big") + data[i : i + frame] for i in range(0, len(data), frame)]
    return [*frames, bytes(8)]


@settings(max_examples=15, deadline=None)
@given(frame=st.integers(min_value=1, max_value=40_000), cuts=st.lists(st.integers(min_value=0), max_size=4))
def test_an_archive_is_unpacked_off_its_frames_however_they_are_cut(
    tmp_path_factory: pytest.TempPathFactory, frame: int, cuts: list[int]
) -> None:
    tmp = tmp_path_factory.mktemp("a")
    files = {"a/one.txt": b"one\n", "blob.bin": bytes(range(256)) * 300}
    wire = b"".join(_framed(_tar(files), frame)) + encode_status(Status(ok=True, size=76804, entries=2))
    thread = _serve(tmp / "files.sock", _split(wire, cuts))
    where = transfers.Endpoint(socket.AF_UNIX, str(tmp / "files.sock"), TICKET, "gw")
    assert transfers.download_archive_into(where, tmp / "out") == (2, len(files["a/one.txt"]) + len(files["blob.bin"]))
    assert {
        p.relative_to(tmp / "out").as_posix(): p.read_bytes() for p in (tmp / "out").rglob("*") if p.is_file()
    } == files
    thread.join(5)


def test_an_archive_refused_or_cut_half_way_raises(where: transfers.Endpoint, tmp_path: Path) -> None:
    tar = _tar({"big": b"x" * 30_000})
    refusal = encode_status(Status(ok=False, code="RESOURCE_EXHAUSTED", message="over the limit"))
    thread = _serve(Path(str(where.address)), [*_framed(tar[:10_240], 10_240), refusal])
    with pytest.raises(warmshell.ResourceExhausted, match="over the limit"):
        transfers.download_archive_into(where, tmp_path / "refused")
    thread.join(5)
    Path(str(where.address)).unlink()
    thread = _serve(Path(str(where.address)), [(len(tar)).to_bytes(8, "big") + tar[:5000]])
    with pytest.raises(warmshell.Unavailable, match="ended before its end frame"):
        transfers.download_archive_into(where, tmp_path / "cut")
    thread.join(5)


@settings(max_examples=15, deadline=None)
@given(size=st.integers(min_value=0, max_value=3 * 1024 * 1024), cuts=st.lists(st.integers(min_value=0), max_size=3))
def test_a_download_to_a_file_writes_exactly_the_stated_bytes(
    tmp_path_factory: pytest.TempPathFactory, size: int, cuts: list[int]
) -> None:
    tmp = tmp_path_factory.mktemp("f")
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    thread = _serve(tmp / "files.sock", _split(encode_status(Status(ok=True, size=size)) + body, cuts))
    with open(tmp / "out", "wb") as handle:
        written = transfers.download_to_file(
            transfers.Endpoint(socket.AF_UNIX, str(tmp / "files.sock"), TICKET, "gw"), handle
        )
    assert written == size
    assert (tmp / "out").read_bytes() == body
    thread.join(5)


def test_a_download_to_a_file_cut_short_is_unavailable(where: transfers.Endpoint, tmp_path: Path) -> None:
    thread = _serve(Path(str(where.address)), [encode_status(Status(ok=True, size=10)), b"1234"])
    with open(tmp_path / "out", "wb") as handle, pytest.raises(warmshell.Unavailable, match="ended after 4 of 10"):
        transfers.download_to_file(where, handle)
    thread.join(5)
