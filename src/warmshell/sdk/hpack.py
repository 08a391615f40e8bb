"""HPACK (RFC 7541), the header compression of HTTP/2, as far as a gRPC client needs it: a full
decoder (static and dynamic table, Huffman strings) for what the gateway sends, and an encoder
that writes every request header as a plain literal (valid HPACK that needs no state).

Part of the small HTTP/2 client in `warmshell.sdk.http2`; the `hpack` package would do the same
but pulls in `logging` and costs 20-30 ms to import, which a CLI call cannot afford.
"""

from __future__ import annotations

from warmshell.sdk.hpack_tables import HUFFMAN_CODES, HUFFMAN_LENGTHS, STATIC_TABLE

__all__ = ["HeaderDecoder", "HpackError", "encode_headers", "huffman_decode"]

_ENTRY_OVERHEAD = 32  # RFC 7541 4.1: an entry's size is name + value + 32
_EOS = 256

# (length in bits, code) -> symbol, built on the first Huffman string.
_huffman_symbols: dict[tuple[int, int], int] = {}


class HpackError(Exception):
    """A header block that breaks RFC 7541 (a connection error: the connection is dropped)."""


def huffman_decode(data: bytes) -> bytes:
    """The octets a Huffman-coded string stands for (RFC 7541 5.2, Appendix B)."""
    if not _huffman_symbols:
        _huffman_symbols.update(((HUFFMAN_LENGTHS[s], HUFFMAN_CODES[s]), s) for s in range(_EOS + 1))
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            symbol = _huffman_symbols.get((length, code))
            if symbol is not None:
                if symbol == _EOS:
                    raise HpackError("Huffman string contains the end-of-string symbol")
                out.append(symbol)
                code = length = 0
            elif length >= 30:
                raise HpackError("invalid Huffman code")
    # What is left must be padding: fewer than 8 bits, all ones (the EOS prefix).
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("invalid Huffman padding")
    return bytes(out)


def _integer(data: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer with an N-bit prefix starting at data[at] (RFC 7541 5.1); (value, next index)."""
    limit = (1 << prefix_bits) - 1
    value = data[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    while True:
        if at >= len(data):
            raise HpackError("truncated integer")
        byte = data[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
        if shift > 28:
            raise HpackError("integer too large")


def _string(data: bytes, at: int) -> tuple[str, int]:
    if at >= len(data):
        raise HpackError("truncated string")
    huffman = data[at] & 0x80
    length, at = _integer(data, at, 7)
    raw = data[at : at + length]
    if len(raw) != length:
        raise HpackError("truncated string")
    text = huffman_decode(raw) if huffman else raw
    return text.decode("utf-8", errors="replace"), at + length


class HeaderDecoder:
    """Decodes the header blocks of one connection in order (the dynamic table is shared by all
    of them, so one decoder per connection)."""

    def __init__(self, max_table_size: int = 4096, *, max_list_size: int | None = None) -> None:
        """`max_list_size`: the most a decoded block may hold (RFC 7541's size: name + value +
        32 per field); past it the block is refused, however small it was on the wire."""
        self._list_limit = max_list_size
        self._limit = max_table_size  # what we advertised (SETTINGS_HEADER_TABLE_SIZE)
        self._max = max_table_size  # what the peer's encoder currently uses
        self._table: list[tuple[str, str]] = []  # newest first
        self._size = 0

    def _entry(self, index: int) -> tuple[str, str]:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dynamic = index - len(STATIC_TABLE) - 1
        if 0 <= dynamic < len(self._table):
            return self._table[dynamic]
        raise HpackError(f"header index {index} is not in the table")

    def _evict(self) -> None:
        while self._size > self._max and self._table:
            name, value = self._table.pop()
            self._size -= len(name.encode()) + len(value.encode()) + _ENTRY_OVERHEAD

    def _add(self, name: str, value: str) -> None:
        self._table.insert(0, (name, value))
        self._size += len(name.encode()) + len(value.encode()) + _ENTRY_OVERHEAD
        self._evict()

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The (name, value) pairs of one complete header block."""
        headers: list[tuple[str, str]] = []
        at = size = 0
        while at < len(block):
            if self._list_limit is not None and size > self._list_limit:
                raise HpackError(f"a header list past {self._list_limit} octets decoded")
            byte = block[at]
            if byte & 0x80:  # indexed header field
                index, at = _integer(block, at, 7)
                field = self._entry(index)
                headers.append(field)
                size += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
                continue
            if byte & 0xE0 == 0x20:  # dynamic table size update
                size, at = _integer(block, at, 5)
                if size > self._limit:
                    raise HpackError(f"table size {size} exceeds the advertised {self._limit}")
                self._max = size
                self._evict()
                continue
            indexing = bool(byte & 0x40)  # literal with incremental indexing, else without/never
            index, at = _integer(block, at, 6 if indexing else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, at = _string(block, at)
            value, at = _string(block, at)
            if indexing:
                self._add(name, value)
            headers.append((name, value))
            size += len(name) + len(value) + _ENTRY_OVERHEAD
        if self._list_limit is not None and size > self._list_limit:
            raise HpackError(f"a header list past {self._list_limit} octets decoded")
        return headers


def _literal(text: str) -> bytes:
    raw = text.encode()
    length = len(raw)
    if length < 0x7F:
        return bytes((length,)) + raw
    out = bytearray((0x7F,))
    length -= 0x7F
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + raw


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    """A header block of literals without indexing and without Huffman coding (RFC 7541 6.2.2)."""
    return b"".join(b"\x00" + _literal(name) + _literal(value) for name, value in headers)
