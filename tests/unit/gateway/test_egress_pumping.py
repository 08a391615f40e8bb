"""The per-sandbox byte rate of the egress proxy (a token bucket on an injected clock)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.gateway.egress.heads import CHUNKED, BadRequest
from warmshell.gateway.egress.pumping import TokenBucket, copy_body


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_second_of_burst_then_the_rate() -> None:
    clock = _Clock()
    bucket = TokenBucket(1000, clock=clock)
    assert bucket.delay(1000) == 0.0
    assert bucket.delay(500) == 0.5
    clock.now = 0.5
    assert bucket.delay(0) == 0.0


@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(0, 2)), min_size=1, max_size=50))
def test_waiting_as_told_never_exceeds_the_rate_plus_the_burst(takes: list[tuple[int, float]]) -> None:
    clock = _Clock()
    bucket = TokenBucket(1000, clock=clock)
    sent = 0
    for size, pause in takes:
        sent += size
        clock.now += bucket.delay(size) + pause
        assert sent <= 1000 * (clock.now + 1) + 1e-6 * sent


class _Sink:
    """What a body copy wrote (a StreamWriter's write and drain)."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass


async def _copied(stream: bytes, length: int) -> tuple[bytes, bytes]:
    """What `copy_body` copied of `stream`, and what it left unread."""
    reader = asyncio.StreamReader()
    reader.feed_data(stream)
    reader.feed_eof()
    sink = _Sink()
    await copy_body(reader, sink, length, TokenBucket(1 << 40), lambda _: None)  # type: ignore[arg-type]
    return sink.data, await reader.read()


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=5), st.binary(max_size=50))
def test_a_chunked_body_is_copied_to_its_end_and_no_further(chunks: list[bytes], after: bytes) -> None:
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\nX-T: 1\r\n\r\n"
    assert asyncio.run(_copied(body + after, CHUNKED)) == (body, after)


@given(st.binary(max_size=300), st.binary(max_size=50))
def test_a_sized_body_is_copied_to_its_length_and_no_further(body: bytes, after: bytes) -> None:
    assert asyncio.run(_copied(body + after, len(body))) == (body, after)


def test_a_malformed_chunk_size_or_a_short_body_is_refused() -> None:
    with pytest.raises(BadRequest):
        asyncio.run(_copied(b"zz\r\nab\r\n0\r\n\r\n", CHUNKED))
    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(_copied(b"abc", 10))
