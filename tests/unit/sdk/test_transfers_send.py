"""`transfers.upload_planned` against a real Unix socket: what arrives is exactly the tar
`pack_directory` packs (headers gathered, larger files by sendfile), and a file that shrank
after it was planned ends the stream short with an error."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmshell.core.transfers import HELLO_BYTES, PREFACE, TICKET_BYTES, Status, encode_status
from warmshell.sdk import archives, transfers

TICKET = b"t" * TICKET_BYTES


class _Receiver:
    """A listener that takes one connection, reads all of it, then answers `status`."""

    def __init__(self, path: Path, status: Status) -> None:
        self.received = b""
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(1)
        self._status = status
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._listener, self._listener.accept()[0] as conn:
            pieces = []
            while data := conn.recv(1 << 20):
                pieces.append(data)
            self.received = b"".join(pieces)
            with contextlib.suppress(BrokenPipeError):  # a client that gave up is gone
                conn.sendall(encode_status(self._status))

    def join(self) -> bytes:
        self._thread.join(10)
        return self.received


@settings(max_examples=10, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 511, 512, 65_535, 65_536, 200_000]), min_size=1, max_size=5))
def test_what_arrives_is_the_packed_tar(tmp_path_factory: pytest.TempPathFactory, sizes: list[int]) -> None:
    tmp = tmp_path_factory.mktemp("p")
    tree = tmp / "tree"
    for i, size in enumerate(sizes):
        (tree / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 2}" / f"f{i}").write_bytes(bytes([i]) * size)
    (tree / "link").symlink_to("d0")
    plan = archives.plan_directory(tree)
    receiver = _Receiver(tmp / "files.sock", Status(ok=True, size=sum(sizes), entries=len(sizes) + 3))
    where = transfers.Endpoint(socket.AF_UNIX, str(tmp / "files.sock"), TICKET, "gw")
    assert transfers.upload_planned(where, plan).size == sum(sizes)
    received = receiver.join()
    assert received[:HELLO_BYTES] == PREFACE + TICKET
    assert received[HELLO_BYTES:] == b"".join(archives.pack_directory(tree))
    assert len(received) - HELLO_BYTES == archives.planned_size(plan)


def test_a_file_that_shrank_since_it_was_planned_ends_the_stream_short(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "big").write_bytes(b"x" * 300_000)
    plan = archives.plan_directory(tree)
    (tree / "big").write_bytes(b"x" * 1000)
    receiver = _Receiver(tmp_path / "files.sock", Status(ok=False, code="INVALID_ARGUMENT", message="short"))
    where = transfers.Endpoint(socket.AF_UNIX, str(tmp_path / "files.sock"), TICKET, "gw")
    with pytest.raises(OSError, match="big: shrank while being sent"):
        transfers.upload_planned(where, plan)
    assert len(receiver.join()) < HELLO_BYTES + archives.planned_size(plan)
