"""The idle connections of the SDK's HTTP/2 transport, kept open for the next call and watched
while they wait.

Why watched: a gateway's graceful stop (grpc's) sends each connection a GOAWAY and a PING, and
closes a connection once that PING is answered; only calls in flight should hold it open. A
connection no call reads answers nothing, so one idle in a client's pool held the stop for
its whole grace: 5.05 s, against 0.03-0.07 s once watched. One thread per pool waits on the
idle sockets: it answers what the gateway says in passing (PING, SETTINGS) and closes a
connection the gateway has closed or asked to go away (GOAWAY), so a stop ends as soon as the
calls in flight do. The thread starts with the first idle connection (~0.2 ms of CPU, once per
client; ~4 us per call after) and ends with the pool: `close()`, or the pool garbage-collected.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import weakref

from warmshell.sdk import errors, http2

__all__ = ["IdlePool"]

_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL


class IdlePool:
    """Idle `http2.Connection`s, thread-safe: `take` one for a call, `put` it back after."""

    def __init__(self) -> None:
        self._idle: list[http2.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._bell: socket.socket | None = None  # wakes the watcher; closing it ends the watcher
        self._rung = False  # a wake-up the watcher has not seen yet

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)

    def take(self) -> http2.Connection | None:
        """An idle connection fit for a new call (`http2.Connection.idle_and_open`), or None;
        the unfit ones met on the way are closed. `errors.Error` once the pool is closed."""
        while True:
            with self._lock:
                if self._closed:
                    raise errors.Error("the client is closed")
                if not self._idle:
                    return None
                conn = self._idle.pop()
            # The watcher may not have seen what the gateway said last (it runs when it can).
            if conn.idle_and_open():
                return conn
            conn.close()

    def put(self, conn: http2.Connection) -> None:
        """Keep `conn` for the next call if it ended its last one cleanly, else close it."""
        with self._lock:
            if conn.usable and not self._closed:
                self._idle.append(conn)
                self._wake_watcher()
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections and end the watcher (idempotent)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            if self._bell is not None:
                self._bell.close()
        for conn in idle:
            conn.close()

    def _wake_watcher(self) -> None:
        """Have the watcher look at the idle list again, starting it first if need be (called
        with the lock held)."""
        if self._bell is None:
            self._bell, ear = socket.socketpair()
            self._bell.setblocking(False)
            # A pool dropped without close(): closing the bell ends the watcher all the same.
            weakref.finalize(self, self._bell.close)
            watcher = threading.Thread(
                target=_watch, args=(weakref.ref(self), ear), name="warmshell-http2-idle", daemon=True
            )
            watcher.start()
        elif self._rung:
            return
        self._rung = True
        # OSError: full (the watcher is behind; it will look anyway).
        with contextlib.suppress(OSError):
            self._bell.send(b"\0")

    def _watched(self) -> list[http2.Connection] | None:
        """The connections to wait on now; None once the pool is closed."""
        with self._lock:
            self._rung = False
            return None if self._closed else list(self._idle)

    def _settle(self, ready: list[http2.Connection]) -> None:
        """Read what the gateway sent on `ready` connections still idle; close those it has
        closed or asked to go away (GOAWAY), as `take` would."""
        with self._lock:
            for conn in ready:
                if conn in self._idle and not conn.idle_and_open():
                    self._idle.remove(conn)
                    conn.close()


def _watch(pool_ref: weakref.ref[IdlePool], ear: socket.socket) -> None:
    """The watcher thread: wait until an idle connection is readable, or the bell rings (the idle
    list changed) or closes (the pool did), and act on it. It holds no reference to the pool while
    it waits, so a pool nobody closed can still be collected."""
    with ear:
        while True:
            pool = pool_ref()
            watched = None if pool is None else pool._watched()
            del pool
            if watched is None:
                return
            poller = select.poll()
            poller.register(ear, select.POLLIN)
            by_fd: dict[int, http2.Connection] = {}
            for conn in watched:
                fd = conn.fileno()
                if fd >= 0:  # -1: taken by a call since, and closed
                    by_fd[fd] = conn
                    poller.register(fd, select.POLLIN)
            events = poller.poll()
            if any(fd == ear.fileno() for fd, _ in events) and not ear.recv(4096):
                return  # the bell was closed: the pool is closed or gone
            ready = [by_fd[fd] for fd, event in events if fd in by_fd and event & _READABLE]
            pool = pool_ref()
            if pool is None:
                return
            pool._settle(ready)
            del pool
