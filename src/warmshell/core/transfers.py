"""The byte stream's wire format, shared by the gateway and the SDK (pure: no I/O).

A file transfer off gRPC's message path: the client asks `FileService.OpenFileTransfer` for a
one-time ticket, connects to the gateway's byte stream and sends `PREFACE` followed by the raw
ticket. Then:

- upload: the client sends exactly the size the ticket names and shuts its side down; the
  gateway answers one status line once the file is in place (or refused);
- download: the gateway answers one status line (with the size) and then that many bytes;
- archive download (a tar, its size unknown until packed): frames of an 8-byte big-endian length
  and that many bytes, then a frame of length 0 and a status line (a refusal half-way included).

A status line is JSON on one line: `{"ok": true, "size": N, "entries": E}` (an archive's entries
and its files' bytes; a file's bytes) or `{"ok": false, "code": "NOT_FOUND", "message": "..."}`,
where `code` is a gRPC status name, so the SDK raises what the gRPC path would have raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "FRAME_END",
    "FRAME_HEADER_BYTES",
    "HELLO_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_STATUS_BYTES",
    "PREFACE",
    "TICKET_BYTES",
    "Status",
    "encode_status",
    "parse_status",
]

PREFACE = b"WSX1"
# 256 bits from the OS's CSPRNG: unguessable, whatever the number of tickets outstanding.
TICKET_BYTES = 32
HELLO_BYTES = len(PREFACE) + TICKET_BYTES
MAX_STATUS_BYTES = 4096
FRAME_HEADER_BYTES = 8
FRAME_END = bytes(FRAME_HEADER_BYTES)
# A frame larger than this is not one the gateway sends (a client refuses it, unallocated).
MAX_FRAME_BYTES = 16 * 1024 * 1024
# A download this small may come in OpenFileTransfer's reply (when the client allows it): a
# ticket, a connection and a status line cost ~0.25 ms more than a 10-byte read's gRPC call did,
# and at 64 KiB the bytes still cost less than that in one protobuf message.
INLINE_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Status:
    """One status line: success with a size (and an archive's entries), or a gRPC status name
    and its message."""

    ok: bool
    size: int = 0
    code: str = ""
    message: str = ""
    entries: int = 0


def encode_status(status: Status) -> bytes:
    """The line for `status` (a message is cut so that the line stays under MAX_STATUS_BYTES)."""
    if status.ok:
        body: dict[str, object] = {"ok": True, "size": status.size, "entries": status.entries}
    else:
        body = {"ok": False, "code": status.code, "message": status.message[: MAX_STATUS_BYTES // 8]}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def parse_status(line: bytes) -> Status:
    """The status a line says; ValueError naming what is wrong for anything else."""
    if not line.endswith(b"\n") or len(line) > MAX_STATUS_BYTES:
        raise ValueError("status line: not one line of at most 4096 bytes")
    try:
        body = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"status line: not JSON ({exc})") from None
    if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
        raise ValueError("status line: `ok` must be true or false")
    if body["ok"]:
        return Status(ok=True, size=_count(body, "size"), entries=_count(body, "entries", 0))
    code, message = body.get("code"), body.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        raise ValueError("status line: `code` and `message` must be strings")
    return Status(ok=False, code=code, message=message)


def _count(body: dict[str, object], name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"status line: `{name}` must be a non-negative integer")
    return value
