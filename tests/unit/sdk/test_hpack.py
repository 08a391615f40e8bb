"""HPACK as the HTTP/2 client decodes it: the RFC 7541 examples, Huffman strings of any octets,
the dynamic table across header blocks, and literals round-tripping through the encoder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.sdk.hpack import HeaderDecoder, HpackError, _integer, encode_headers, huffman_decode
from warmshell.sdk.hpack_tables import HUFFMAN_CODES, HUFFMAN_LENGTHS


def _huffman_encode(data: bytes) -> bytes:
    value = bits = 0
    for byte in data:
        value = (value << HUFFMAN_LENGTHS[byte]) | HUFFMAN_CODES[byte]
        bits += HUFFMAN_LENGTHS[byte]
    pad = -bits % 8
    value = (value << pad) | ((1 << pad) - 1)
    return value.to_bytes((bits + pad) // 8, "big")


def test_integers_with_a_prefix_rfc7541_c1() -> None:
    assert _integer(bytes([0b01010]), 0, 5) == (10, 1)
    assert _integer(bytes([0b11111, 0b10011010, 0b00001010]), 0, 5) == (1337, 3)
    assert _integer(bytes([42]), 0, 8) == (42, 1)


def test_requests_with_huffman_share_a_dynamic_table_rfc7541_c4() -> None:
    decoder = HeaderDecoder()
    first = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")
    assert decoder.decode(first) == [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ]
    second = bytes.fromhex("828684be5886a8eb10649cbf")
    assert decoder.decode(second) == [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ]
    third = bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")
    assert decoder.decode(third) == [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ]


@given(st.binary(max_size=300))
def test_huffman_decodes_what_the_rfc_code_encodes(data: bytes) -> None:
    assert huffman_decode(_huffman_encode(data)) == data


def test_bad_huffman_padding_and_unknown_indexes_are_errors() -> None:
    with pytest.raises(HpackError, match="padding"):
        huffman_decode(_huffman_encode(b"a")[:-1] + bytes([_huffman_encode(b"a")[-1] & 0xFE]))
    with pytest.raises(HpackError, match="not in the table"):
        HeaderDecoder().decode(bytes([0x80 | 70]))  # index 70: past the static table, empty dynamic one


def test_a_table_size_update_evicts_and_may_not_exceed_the_advertised_size() -> None:
    decoder = HeaderDecoder()
    decoder.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff"))  # adds :authority
    decoder.decode(bytes([0x20]))  # size 0: everything evicted
    with pytest.raises(HpackError):
        decoder.decode(bytes([0x80 | 62]))
    with pytest.raises(HpackError, match="exceeds"):
        decoder.decode(bytes([0x3F, 0xE2, 0x1F]))  # 31 + 0x62 + (31 << 7) = 4097 > 4096


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300)


@given(st.lists(st.tuples(_text, _text), max_size=8))
def test_the_encoders_literals_decode_to_the_same_headers(headers: list[tuple[str, str]]) -> None:
    assert HeaderDecoder().decode(encode_headers(headers)) == headers
