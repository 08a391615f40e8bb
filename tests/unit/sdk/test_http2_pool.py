"""The HTTP/2 transport's pool of idle connections against scripted peers on socketpairs: what
the gateway says to a connection nobody is calling on is answered (PING, SETTINGS) or ends it
(GOAWAY, a close) at once, a connection taken for a call is left to the call, and the watcher
thread ends with its pool."""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.unit.sdk.test_http2 import Peer, _frame
from warmshell.sdk import errors, http2
from warmshell.sdk.http2_pool import IdlePool

PING, GOAWAY, SETTINGS = 6, 7, 4


def _until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.005)


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "warmshell-http2-idle"]


@pytest.fixture
def peers() -> Iterator[Callable[[], tuple[http2.Connection, Peer]]]:
    made: list[tuple[http2.Connection, Peer]] = []

    def make() -> tuple[http2.Connection, Peer]:
        client_end, server_end = socket.socketpair()
        client_end.settimeout(5)
        peer = Peer(server_end)
        made.append((http2.Connection(client_end), peer))
        return made[-1]

    yield make
    for conn, peer in made:
        conn.close()
        peer.sock.close()


def _peer_closed(peer: Peer) -> bool:
    return not peer._reader.is_alive()  # its reader ends at the end of the stream


def test_a_ping_on_an_idle_connection_is_answered_while_nobody_calls(
    peers: Callable[[], tuple[http2.Connection, Peer]],
) -> None:
    pool = IdlePool()
    conn, peer = peers()
    pool.put(conn)
    peer.send(_frame(SETTINGS, 0, 0), _frame(PING, 0, 0, b"stopping"))
    _until(lambda: (PING, 1, 0, b"stopping") in peer.frames, "the PING acknowledged")
    assert (SETTINGS, 1, 0, b"") in peer.frames
    assert len(pool) == 1
    assert pool.take() is conn  # upkeep leaves the connection fit for a call
    pool.close()


def test_a_goaway_or_a_close_on_an_idle_connection_ends_it_at_once(
    peers: Callable[[], tuple[http2.Connection, Peer]],
) -> None:
    pool = IdlePool()
    told, told_peer = peers()
    closed, closed_peer = peers()
    kept, kept_peer = peers()
    for conn in (told, closed, kept):
        pool.put(conn)
    # grpc's graceful stop: GOAWAY with the highest stream id, and a PING to learn when it arrived.
    told_peer.send(_frame(GOAWAY, 0, 0, b"\x7f\xff\xff\xff\0\0\0\0"), _frame(PING, 0, 0, b"12345678"))
    closed_peer.sock.shutdown(socket.SHUT_WR)
    _until(lambda: _peer_closed(told_peer) and _peer_closed(closed_peer), "both connections closed")
    assert not told.usable
    assert not closed.usable
    assert len(pool) == 1
    assert pool.take() is kept
    assert not _peer_closed(kept_peer)
    pool.close()


def test_a_connection_taken_for_a_call_is_left_to_the_call(peers: Callable[[], tuple[http2.Connection, Peer]]) -> None:
    pool = IdlePool()
    conn, peer = peers()
    pool.put(conn)
    peer.send(_frame(PING, 0, 0, b"watching"))  # answered: the watcher is waiting on it
    _until(lambda: (PING, 1, 0, b"watching") in peer.frames, "the PING acknowledged")
    assert pool.take() is conn
    peer.send(_frame(PING, 0, 0, b"for-call"))
    time.sleep(0.3)  # time for a watcher that wrongly read it
    assert (PING, 1, 0, b"for-call") not in peer.frames
    assert conn.read_frame() == (PING, 0, 0, b"for-call")  # still there for the call to read
    pool.put(conn)
    peer.send(_frame(PING, 0, 0, b"idle-now"))
    _until(lambda: (PING, 1, 0, b"idle-now") in peer.frames, "the PING acknowledged once idle again")
    pool.close()


def test_the_watcher_ends_with_its_pool_closed_or_dropped(peers: Callable[[], tuple[http2.Connection, Peer]]) -> None:
    before = set(_watchers())  # other tests' watchers, perhaps still ending
    closed_pool, dropped_pool = IdlePool(), IdlePool()
    conn, peer = peers()
    closed_pool.put(conn)
    dropped_pool.put(peers()[0])
    _until(lambda: len(set(_watchers()) - before) == 2, "both watchers started")
    ours = set(_watchers()) - before
    closed_pool.close()
    _until(lambda: _peer_closed(peer), "the idle connection closed with its pool")
    with pytest.raises(errors.Error, match="closed"):
        closed_pool.take()
    del dropped_pool
    gc.collect()
    _until(lambda: not any(thread.is_alive() for thread in ours), "both watchers ended")
