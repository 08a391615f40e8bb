"""The agent's records, host side: what is sent and what is accepted back."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.sandboxio import agentwire
from warmshell.sandboxio.agentwire import Kind, Reply, WireError


def test_exec_record_layout() -> None:
    record = agentwire.encode_exec(7, ["sh", "-c", "echo hi"], {"A": "1"}, "/workspace")
    assert struct.unpack("=4I", record[:16]) == (ord("X"), 7, 3, 1)
    assert record[16:] == b"/workspace\0sh\0-c\0echo hi\0A=1\0"


@pytest.mark.parametrize(
    ("argv", "env", "cwd", "match"),
    [
        ([], {}, "/", "must not be empty"),
        (["a\0b"], {}, "/", "NUL"),
        (["a"], {"A=B": "1"}, "/", "contain no '='"),
        (["a"], {"": "1"}, "/", "non-empty"),
        (["a"], {}, "/\0", "NUL"),
        (["x" * (agentwire.MAX_MESSAGE + 1)], {}, "/", "KiB"),
        (["a"] * (agentwire.MAX_STRINGS + 1), {}, "/", "entries"),
    ],
)
def test_exec_records_that_cannot_be_sent(argv: list[str], env: dict[str, str], cwd: str, match: str) -> None:
    with pytest.raises(WireError, match=match):
        agentwire.encode_exec(1, argv, env, cwd)


def test_signal_record() -> None:
    assert agentwire.encode_signal(3, 9) == struct.pack("=4I", ord("K"), 3, 9, 0)
    with pytest.raises(WireError, match=r"1\.\.64"):
        agentwire.encode_signal(3, 0)


def test_finish_record() -> None:
    assert agentwire.encode_finish() == struct.pack("=4I", ord("Q"), 0, 0, 0)


def test_root_record() -> None:
    assert agentwire.encode_root(7) == struct.pack("=4I", ord("G"), 7, 0, 0)
    with pytest.raises(WireError, match=r"1\.\.2\^32-1"):
        agentwire.encode_root(0)
    assert agentwire.decode_reply(struct.pack("=4I", ord("D"), 7, 0, 0)) == Reply(Kind.ROOT_DIR, 7, 0, 0)


def test_replies_parse_exactly() -> None:
    assert agentwire.decode_reply(struct.pack("=4I", ord("E"), 5, 256, 0)) == Reply(Kind.EXITED, 5, 256, 0)


@given(st.binary(max_size=64))
def test_any_other_bytes_are_refused(data: bytes) -> None:
    known = {
        k.value for k in (Kind.HELLO, Kind.STARTED, Kind.FAILED, Kind.EXITED, Kind.REJECTED, Kind.PONG, Kind.ROOT_DIR)
    }
    if len(data) == agentwire.REPLY_SIZE and struct.unpack("=I", data[:4])[0] in known:
        assert agentwire.decode_reply(data).kind.value in known
    else:
        with pytest.raises(WireError):
            agentwire.decode_reply(data)


def test_an_exec_on_a_terminal_is_the_same_record_with_its_own_kind() -> None:
    plain = agentwire.encode_exec(5, ["sh"], {"A": "1"}, "/")
    tty = agentwire.encode_exec(5, ["sh"], {"A": "1"}, "/", tty=True)
    assert tty[4:] == plain[4:]
    assert struct.unpack_from("=I", tty)[0] == agentwire.Kind.EXEC_TTY == ord("T")
