"""The supervisor's end of an agent channel that is a Unix socket path, not an inherited socket.

On Kubernetes the supervisor and the workload are two containers of one pod: the agent (pid 1 of
the workload container) connects to a SOCK_SEQPACKET listener the supervisor makes on an
`emptyDir` both mount. The supervisor accepts exactly one connection per listener, from the
workload's uid (its peer credentials), and unlinks the path as soon as it has it: whatever the
workload starts afterwards finds nothing to connect to, and a connection made before the agent's
(none can be: the agent is the container's first process) would only be refused by the uid or
taken instead of the agent, which then cannot connect and ends its container. The socket then
carries the agent protocol (`agentwire`, `agentlink.AgentLink`) exactly as the local driver's
inherited one does.

Paths are plain strings here: `pathlib` (with the `urllib.parse` and `ipaddress` it imports)
would be most of what the agent channel adds to a pod supervisor's imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct

__all__ = ["AgentRefused", "accept_agent"]

log = logging.getLogger(__name__)
_UCRED = struct.Struct("=iII")  # pid, uid, gid


class AgentRefused(OSError):
    """No acceptable agent connected in time."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process that connected `sock` (SO_PEERCRED, as the kernel recorded it)."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


def listen(path: str | os.PathLike[str]) -> socket.socket:
    """A fresh listener at `path` (a stale one, from a supervisor that ran before, is replaced),
    connectable by any uid: the peer's uid is checked at accept."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        listener.bind(os.fspath(path))
        os.chmod(path, 0o666)
        listener.listen(4)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    return listener


async def accept_agent(path: str | os.PathLike[str], *, uid: int, timeout: float) -> socket.socket:  # noqa: ASYNC109 - the wait's own bound
    """Listen at `path`, accept the first connection from `uid`, unlink `path` and return the
    connection (non-blocking). Connections from another uid are closed and logged. AgentRefused
    when none came within `timeout` seconds."""
    listener = listen(path)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            while True:
                connection, _ = await loop.sock_accept(listener)
                found = peer_uid(connection)
                if found == uid:
                    return connection
                log.warning("agent channel %s: refused a connection from uid %d (expected %d)", path, found, uid)
                connection.close()
    except TimeoutError:
        raise AgentRefused(f"no agent connected to {path} within {timeout:g}s") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # one unlink on a local volume, once per container start
        listener.close()
