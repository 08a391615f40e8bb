"""The background commands' output ring against a model (every byte ever written): a reader at
any position gets exactly the bytes it has not read that are still held, in order, tagged with
their stream, and the count of those that were dropped before it read them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmshell.sandboxio.outputring import OutputRing

writes = st.lists(st.tuples(st.booleans(), st.binary(max_size=40)), max_size=30)


@given(capacity=st.integers(1, 64), writes=writes, position=st.integers(0, 1300))
def test_a_reader_gets_what_is_held_after_it_and_the_count_of_what_was_dropped(
    capacity: int, writes: list[tuple[bool, bytes]], position: int
) -> None:
    ring = OutputRing(capacity)
    tagged = b""  # the model: each byte with its stream, as (stream, byte) pairs packed in order
    for stderr, data in writes:
        ring.append(stderr, data)
        tagged += b"".join(bytes([stderr, byte]) for byte in data)
    total = len(tagged) // 2
    position = min(position, total)
    assert ring.end == total
    assert ring.start == max(0, total - capacity)
    dropped, chunks = ring.read(position)
    assert dropped == max(0, ring.start - position)
    first = max(position, ring.start)
    assert b"".join(bytes([c.stderr, byte]) for c in chunks for byte in c.data) == tagged[2 * first :]
    offsets = [c.offset for c in chunks]
    assert offsets == [first + sum(len(c.data) for c in chunks[:i]) for i in range(len(chunks))]
    assert all(c.data for c in chunks)


def test_a_write_longer_than_the_ring_keeps_its_tail() -> None:
    ring = OutputRing(4)
    ring.append(False, b"abc")
    ring.append(True, b"0123456789")
    dropped, chunks = ring.read(0)
    assert (dropped, [(c.offset, c.stderr, c.data) for c in chunks]) == (9, [(9, True, b"6789")])
    assert ring.read(13) == (0, [])


@given(
    capacity=st.integers(1, 64),
    copy_capacity=st.integers(1, 64),
    writes=writes,
    replays=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 1300)), max_size=6),
)
def test_a_copy_fed_by_offset_holds_what_it_received_and_counts_the_rest(
    capacity: int, copy_capacity: int, writes: list[tuple[bool, bytes]], replays: list[tuple[int, int]]
) -> None:
    """The gateway's copy of a supervisor's ring, fed from it at any offsets (repeats, replays
    after a reconnect, gaps where the source dropped bytes): it never holds a byte twice or out
    of order, and every byte before what it holds is counted as dropped."""
    source, copy = OutputRing(capacity), OutputRing(copy_capacity)
    model = b""
    for index, (stderr, data) in enumerate(writes):
        source.append(stderr, data)
        model += data
        for after, position in replays:
            if after == index:
                for chunk in source.read(min(position, source.end))[1]:
                    copy.append_at(chunk.offset, chunk.stderr, chunk.data)
    for chunk in source.read(copy.end)[1]:  # the follower catches up at the end
        copy.append_at(chunk.offset, chunk.stderr, chunk.data)
    assert copy.end == source.end == len(model)
    dropped, chunks = copy.read(0)
    held = b"".join(c.data for c in chunks)
    assert dropped + len(held) == len(model)
    assert held == model[dropped:]
    assert len(held) <= copy_capacity
