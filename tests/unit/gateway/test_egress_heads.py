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
