"""Reading a proxy request's head (pure): `CONNECT host:port` or an absolute-form
`GET http://host[:port]/path`, and the origin-form head forwarded upstream in its place."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["BadRequest", "Head", "forwarded_head", "parse_head", "parse_tunnelled_head"]

_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Hop-by-hop headers of the proxy leg (RFC 9110 7.6.1): never passed upstream.
_HOP_BY_HOP = frozenset({b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive", b"te", b"upgrade"})


class BadRequest(Exception):
    """A head the proxy refuses, with the HTTP status it answers."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Head:
    """One request head: its method, where it goes, and what of it is forwarded."""

    method: str
    host: str
    port: int
    path: str  # origin-form ("/x?y"); "" for CONNECT
    version: bytes
    headers: tuple[tuple[bytes, bytes], ...]

    @property
    def tunnel(self) -> bool:
        """CONNECT: after the 200, bytes pass both ways untouched."""
        return self.method == "CONNECT"


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    parsed = urlsplit("//" + text)
    try:
        port = parsed.port
    except ValueError:
        raise BadRequest(400, f"bad port in {text!r}") from None
    if not parsed.hostname or parsed.username is not None or (port is None and default_port is None):
        raise BadRequest(400, f"{text!r} is not host:port")
    return parsed.hostname, port if port is not None else default_port or 0


def _target(method: str, target: str) -> tuple[str, int, str]:
    if method == "CONNECT":
        host, port = _authority(target, None)
        return host, port, ""
    parsed = urlsplit(target)
    if parsed.scheme != "http" or not parsed.netloc:
        raise BadRequest(400, "only absolute http:// URIs are forwarded (use CONNECT for https)")
    host, port = _authority(parsed.netloc, 80)
    path = parsed.path or "/"
    return host, port, path + (f"?{parsed.query}" if parsed.query else "")


def parse_head(data: bytes) -> Head:
    """The head (everything up to and including the blank line); BadRequest when malformed."""
    method, target, version, headers = _split(data)
    host, port, path = _target(method, target)
    return Head(method, host, port, path, version, headers)


def parse_tunnelled_head(data: bytes, *, host: str, port: int) -> Head:
    """A head read inside an intercepted CONNECT tunnel to `host`:`port`: origin-form
    (`GET /path`), going where the tunnel goes whatever its Host header says."""
    method, target, version, headers = _split(data)
    if not target.startswith("/") or method == "CONNECT":
        raise BadRequest(400, "inside a tunnel, only origin-form requests (GET /path) are forwarded")
    return Head(method, host, port, target, version, headers)


def _split(data: bytes) -> tuple[str, str, bytes, tuple[tuple[bytes, bytes], ...]]:
    lines = data.removesuffix(b"\r\n\r\n").split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest(400, "malformed request line")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise BadRequest(400, "malformed header line")
        headers.append((name, value.strip()))
    try:
        target = parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "request target is not ASCII") from None
    return parts[0].decode("ascii"), target, parts[2], tuple(headers)


def forwarded_head(head: Head) -> bytes:
    """The origin-form head sent upstream: hop-by-hop headers dropped, one request per
    connection (`Connection: close`), so every request on it was checked against the policy."""
    lines = [f"{head.method} {head.path} ".encode() + head.version]
    lines += [name + b": " + value for name, value in head.headers if name.lower() not in _HOP_BY_HOP]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
