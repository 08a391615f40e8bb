"""The egress proxy's request heads: what is forwarded where, and what is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.gateway.egress import heads


def test_connect_names_host_and_port() -> None:
    head = heads.parse_head(b"CONNECT pypi.example:443 HTTP/1.1\r\nHost: pypi.example:443\r\n\r\n")
    assert (head.tunnel, head.host, head.port) == (True, "pypi.example", 443)


def test_an_absolute_uri_is_forwarded_in_origin_form_without_proxy_headers() -> None:
    head = heads.parse_head(
        b"GET http://127.0.0.2:8080/simple/?q=1 HTTP/1.1\r\nHost: 127.0.0.2:8080\r\n"
        b"Proxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n"
    )
    assert (head.host, head.port, head.path) == ("127.0.0.2", 8080, "/simple/?q=1")
    assert heads.forwarded_head(head) == (
        b"GET /simple/?q=1 HTTP/1.1\r\nHost: 127.0.0.2:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    "data",
    [
        b"GET /origin-form HTTP/1.1\r\n\r\n",
        b"GET https://tls.example/ HTTP/1.1\r\n\r\n",
        b"CONNECT pypi.example HTTP/1.1\r\n\r\n",
        b"CONNECT pypi.example:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT user@pypi.example:443 HTTP/1.1\r\n\r\n",
        b"GET http://x/ HTTP/2\r\n\r\n",
        b"GET http://x/ HTTP/1.1\r\nno colon\r\n\r\n",
        b"\x00\x01\r\n\r\n",
    ],
)
def test_a_malformed_head_is_a_400(data: bytes) -> None:
    with pytest.raises(heads.BadRequest) as caught:
        heads.parse_head(data)
    assert caught.value.status == 400


@given(st.binary(max_size=300))
def test_any_bytes_either_parse_or_are_a_bad_request(data: bytes) -> None:
    # Anything else (a UnicodeDecodeError, an IndexError) would escape the proxy's handler.
    statuses: list[int] = []
    try:
        head = heads.parse_head(data + b"\r\n\r\n")
    except heads.BadRequest as exc:
        statuses.append(exc.status)
    else:
        assert head.host
        assert 0 <= head.port <= 65535
    assert statuses in ([], [400])


def _tunnelled(*headers: bytes, version: bytes = b"HTTP/1.1") -> heads.Head:
    lines = b"\r\n".join([b"POST /x " + version, *headers])
    return heads.parse_tunnelled_head(lines + b"\r\n\r\n", host="api.example", port=443)


@pytest.mark.parametrize(
    ("headers", "length"),
    [
        ((), 0),
        ((b"Content-Length: 12",), 12),
        ((b"Content-Length: 12", b"content-length: 12"), 12),
        ((b"Transfer-Encoding: gzip, chunked",), heads.CHUNKED),
        ((b"Transfer-Encoding: gzip", b"Transfer-Encoding: Chunked"), heads.CHUNKED),
    ],
)
def test_a_body_is_framed_by_its_length_or_chunks(headers: tuple[bytes, ...], length: int) -> None:
    assert heads.body_length(_tunnelled(*headers)) == length


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ((b"Content-Length: 12", b"Transfer-Encoding: chunked"), "both Content-Length and Transfer-Encoding"),
        ((b"Content-Length: 12", b"Content-Length: 13"), "a bad Content-Length"),
        ((b"Content-Length: -1",), "a bad Content-Length"),
        ((b"Content-Length: 1e3",), "a bad Content-Length"),
        ((b"Transfer-Encoding: chunked, gzip",), "a Transfer-Encoding that does not end in chunked"),
    ],
)
def test_a_body_two_readers_could_frame_two_ways_is_refused(headers: tuple[bytes, ...], reason: str) -> None:
    with pytest.raises(heads.BadRequest) as caught:
        heads.body_length(_tunnelled(*headers))
    assert (caught.value.status, caught.value.reason) == (400, reason)


def test_a_persistent_request_is_forwarded_without_connection_close() -> None:
    assert heads.persistent(_tunnelled())
    assert heads.persistent(_tunnelled(b"Connection: keep-alive"))
    assert not heads.persistent(_tunnelled(b"Connection: Keep-Alive, Close"))
    assert not heads.persistent(_tunnelled(version=b"HTTP/1.0"))
    head = _tunnelled(b"Connection: keep-alive", b"Accept: */*")
    assert heads.forwarded_head(head, keep_alive=True) == b"POST /x HTTP/1.1\r\nAccept: */*\r\n\r\n"
    assert heads.forwarded_head(head).endswith(b"Connection: close\r\n\r\n")
