"""The records the host and a sandbox's agent exchange over its control socket (pure).

The agent (`agent/warmshell-agent.c`, pid 1 of every sandbox) defines the protocol; this module
mirrors it: host byte order, every field a uint32. The host sends EXEC (a header, then cwd, argv
and env as NUL-terminated strings, with the command's stdin/stdout/stderr attached as fds) or
EXEC_TTY (the same, for a command whose three fds are a terminal it takes as its controlling one),
SIGNAL, PING (a liveness probe), ROOT (the agent's root directory, for a pod's supervisor to
serve files in the workload container's filesystem) and FINISH (the sandbox is over: the agent exits 0, where a
socket that only closed means a lost supervisor); the agent answers HELLO once, STARTED or FAILED for each
EXEC, EXITED when it ends, PONG to each PING, ROOT_DIR to each ROOT (with an fd on its `/`
attached, or the open's errno), and REJECTED for a record it refused. Nothing
the agent says is trusted beyond "this exec started or ended" (or "alive", or "a directory of
my world"): a reply that does
not parse ends the sandbox.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_MESSAGE",
    "MAX_STRINGS",
    "REPLY_SIZE",
    "VERSION",
    "Kind",
    "Reply",
    "Stage",
    "WireError",
    "decode_reply",
    "encode_exec",
    "encode_finish",
    "encode_ping",
    "encode_root",
    "encode_signal",
]

VERSION = 1
MAX_MESSAGE = 128 * 1024  # the agent's receive buffer; also under a socket's default send buffer
MAX_STRINGS = 4096  # argv entries, and separately env entries
REPLY_SIZE = 16
_HEADER = struct.Struct("=4I")


class Kind(enum.IntEnum):
    """Record types: ASCII letters, so a hex dump reads."""

    EXEC = ord("X")
    EXEC_TTY = ord("T")
    SIGNAL = ord("K")
    PING = ord("P")
    FINISH = ord("Q")
    ROOT = ord("G")
    HELLO = ord("H")
    STARTED = ord("S")
    FAILED = ord("F")
    EXITED = ord("E")
    REJECTED = ord("R")
    PONG = ord("O")
    ROOT_DIR = ord("D")


class Stage(enum.IntEnum):
    """Where a FAILED exec stopped."""

    CHDIR = 1
    EXEC = 2
    FORK = 3


_REPLIES = frozenset({Kind.HELLO, Kind.STARTED, Kind.FAILED, Kind.EXITED, Kind.REJECTED, Kind.PONG, Kind.ROOT_DIR})


class WireError(ValueError):
    """A record that cannot be sent (too large, bad strings) or a reply that does not parse."""


@dataclass(frozen=True)
class Reply:
    """One agent -> host record; `a` and `b` mean what the kind says (see the agent's source)."""

    kind: Kind
    exec_id: int
    a: int
    b: int


def _cstring(value: str, what: str) -> bytes:
    data = value.encode()
    if b"\0" in data:
        raise WireError(f"{what} contains a NUL byte")
    return data + b"\0"


def encode_exec(exec_id: int, argv: Sequence[str], env: Mapping[str, str], cwd: str, *, tty: bool = False) -> bytes:
    """The EXEC record for one command (its three fds travel beside it); with `tty`, EXEC_TTY."""
    if not 0 < exec_id <= 0xFFFFFFFF:
        raise WireError("exec id must be in 1..2^32-1")
    if not argv:
        raise WireError("command must not be empty")
    if len(argv) > MAX_STRINGS or len(env) > MAX_STRINGS:
        raise WireError(f"command and environment are limited to {MAX_STRINGS} entries each")
    for key in env:
        if not key or "=" in key:
            raise WireError(f"environment name {key!r} must be non-empty and contain no '='")
    body = [_cstring(cwd, "workdir")]
    body += [_cstring(arg, "command") for arg in argv]
    body += [_cstring(f"{key}={value}", "environment") for key, value in env.items()]
    message = _HEADER.pack(Kind.EXEC_TTY if tty else Kind.EXEC, exec_id, len(argv), len(env)) + b"".join(body)
    if len(message) > MAX_MESSAGE:
        raise WireError(f"command, environment and workdir exceed {MAX_MESSAGE // 1024} KiB together")
    return message


def encode_signal(exec_id: int, signo: int) -> bytes:
    """The SIGNAL record: deliver `signo` to that exec's process group."""
    if not 1 <= signo <= 64:
        raise WireError("signal must be in 1..64")
    return _HEADER.pack(Kind.SIGNAL, exec_id, signo, 0)


def encode_ping(ping_id: int) -> bytes:
    """The PING record; the agent answers PONG with the same id."""
    if not 0 < ping_id <= 0xFFFFFFFF:
        raise WireError("ping id must be in 1..2^32-1")
    return _HEADER.pack(Kind.PING, ping_id, 0, 0)


def encode_root(request_id: int) -> bytes:
    """The ROOT record; the agent answers ROOT_DIR with the same id."""
    if not 0 < request_id <= 0xFFFFFFFF:
        raise WireError("root request id must be in 1..2^32-1")
    return _HEADER.pack(Kind.ROOT, request_id, 0, 0)


def encode_finish() -> bytes:
    """The FINISH record: the agent ends everything and exits 0."""
    return _HEADER.pack(Kind.FINISH, 0, 0, 0)


def decode_reply(data: bytes) -> Reply:
    """Parse one agent record; WireError unless it is exactly a known reply."""
    if len(data) != REPLY_SIZE:
        raise WireError(f"agent record of {len(data)} bytes (expected {REPLY_SIZE})")
    kind, exec_id, a, b = _HEADER.unpack(data)
    if kind not in _REPLIES:
        raise WireError(f"agent record of unknown kind {kind:#x}")
    return Reply(Kind(kind), exec_id, a, b)
