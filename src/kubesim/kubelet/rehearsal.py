"""Run, in the fork server before it freezes its heap, the standard library's code that every forked
Python container runs first: an event loop that runs (a task, a timeout, socket reads, writes and an
accept, a reader callback) and a log record formatted and written.

Why: Python 3.11 writes to a function's code object on each of its first calls, until the 8th
specialises it ("quickening"), and specialised code still writes its inline caches until they
settle. A function first called in a forked container writes into a page it shares with the server
and every other container, so the kernel copies that page for it (a copy-on-write fault, ~3-4 µs
of CPU on a 2-core host). Called here often enough, the code is specialised once, in the server's
pages every container shares. Measured in forked children of a server with the pod supervisor
imported (medians of 21): a first log line 537 -> 422 faults (-0.5 ms), a small asyncio program
585 -> 506 (-0.4 ms); a pod supervisor does both on every start.

Reference counts are written all the same (Python 3.11 has no immortal objects): only the code
objects' own writes move here. Nothing outlives a rehearsal: no loop, selector, descriptor, signal
handler, thread, logger or handler.
"""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import sys

__all__ = ["event_loop", "log_record", "rehearse"]

# The calls before Python 3.11 specialises a function, and two more for its inline caches.
QUICKENING_CALLS = 8
_ROUNDS = QUICKENING_CALLS + 2


def rehearse() -> None:
    """Both rehearsals (see the module doc). They only warm code: one the host refuses (no Unix
    sockets in a sandboxed kubesim, say) is skipped, and the server starts all the same."""
    for rehearsal in (event_loop, log_record):
        try:
            rehearsal()
        except OSError as exc:
            print(f"kubesim fork server: {rehearsal.__name__} not rehearsed: {exc}", file=sys.stderr, flush=True)


def event_loop() -> None:
    """Make, run and close an event loop `_ROUNDS` times (`_asyncio_program` in each)."""
    for _ in range(_ROUNDS):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(_asyncio_program())
        finally:
            loop.close()


async def _asyncio_program() -> None:
    """What a small asyncio program does first: a timeout, a task, a future set by a callback,
    an accept on a Unix listener, socket writes and reads, a reader callback."""
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sockets = [listener, client]
    try:
        listener.bind("")  # Linux autobind: an abstract name, no file
        listener.listen(1)
        listener.setblocking(False)
        client.connect(listener.getsockname())
        client.setblocking(False)
        async with asyncio.timeout(5):
            accepted, _ = await loop.sock_accept(listener)
            sockets.append(accepted)
            await asyncio.create_task(asyncio.sleep(0))
            await loop.sock_sendall(client, b"x")
            await loop.sock_recv(accepted, 16)
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(accepted.fileno(), readable.set_result, None)
            try:
                client.send(b"y")
                await readable
            finally:
                loop.remove_reader(accepted.fileno())
    finally:
        for sock in sockets:
            sock.close()


def log_record() -> None:
    """Format and write a log record `_ROUNDS` times, through a logger of its own (not registered
    with `logging.getLogger`'s manager) into a handler that is closed afterwards."""
    logger = logging.Logger("kubesim.rehearsal", logging.INFO)
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    try:
        for n in range(_ROUNDS):
            logger.info("rehearsal %d", n)
    finally:
        logger.removeHandler(handler)
        handler.close()
