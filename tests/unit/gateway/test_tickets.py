"""The byte stream's one-time tickets (`gateway/tickets.py`) and its status lines
(`core/transfers.py`): pure parts, with a clock the test moves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.ids import SandboxId
from warmshell.core.transfers import MAX_STATUS_BYTES, TICKET_BYTES, Status, encode_status, parse_status
from warmshell.gateway.tickets import Direction, Grant, TicketBook

GRANT = Grant(SandboxId("sb-1"), "/workspace/a", Direction.UPLOAD, size=10, max_bytes=100)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_ticket_is_taken_once_and_only_before_it_expires() -> None:
    clock = Clock()
    book = TicketBook(ttl_seconds=30, clock=clock)
    ticket, expires = book.issue(GRANT)
    assert len(ticket) == TICKET_BYTES
    assert expires == 1030.0
    assert book.take(ticket) == GRANT
    assert book.take(ticket) is None  # spent
    late, _ = book.issue(GRANT)
    clock.now += 30
    assert book.take(late) is None
    assert len(book) == 0


def test_tickets_differ_and_a_near_miss_is_not_one() -> None:
    book = TicketBook(ttl_seconds=30, clock=Clock())
    tickets = {book.issue(GRANT)[0] for _ in range(100)}
    assert len(tickets) == 100
    one = next(iter(tickets))
    assert book.take(bytes([one[0] ^ 1]) + one[1:]) is None
    assert book.take(one[:-1]) is None
    assert book.take(one + b"\0") is None
    assert book.take(one) == GRANT  # the misses spent nothing


def test_the_book_is_bounded_and_drops_expired_and_oldest_first() -> None:
    clock = Clock()
    book = TicketBook(ttl_seconds=5, clock=clock, max_outstanding=3)
    old = [book.issue(GRANT)[0] for _ in range(3)]
    newest, _ = book.issue(GRANT)
    assert len(book) == 3
    assert book.take(old[0]) is None
    assert book.take(newest) == GRANT
    clock.now += 6
    book.issue(GRANT)
    assert len(book) == 1  # the expired ones went at the issue


@given(size=st.integers(min_value=0, max_value=2**63), message=st.text(max_size=2000), code=st.text(max_size=40))
def test_status_lines_round_trip(size: int, message: str, code: str) -> None:
    assert parse_status(encode_status(Status(ok=True, size=size))) == Status(ok=True, size=size)
    line = encode_status(Status(ok=False, code=code, message=message))
    assert line.count(b"\n") == 1
    assert len(line) <= MAX_STATUS_BYTES
    parsed = parse_status(line)
    assert (parsed.ok, parsed.code) == (False, code)
    assert message.startswith(parsed.message)


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        (b'{"ok":true,"size":1}', "one line"),
        (b"x" * 5000 + b"\n", "one line"),
        (b"nope\n", "not JSON"),
        (b'{"size":1}\n', "`ok`"),
        (b'{"ok":true,"size":-1}\n', "`size`"),
        (b'{"ok":true,"size":"1"}\n', "`size`"),
        (b'{"ok":false,"code":1,"message":""}\n', "`code`"),
    ],
)
def test_bad_status_lines_are_refused_naming_the_rule(line: bytes, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        parse_status(line)
