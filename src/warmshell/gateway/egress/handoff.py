"""The sockets a local sandbox's agent hands to the egress proxy.

The agent (pid 1 of the sandbox) listens on 127.0.0.1:3128 inside. At the first connection it
accepts, it connects a channel to the proxy's Unix socket, which is bound into that sandbox
alone (so the channel says whose the connection is), and sends two SOCK_SEQPACKET records, each
one byte with a socket attached (SCM_RIGHTS): b"C" with the accepted socket, then b"L" with its
listening socket. The proxy reads and writes the sandbox's sockets itself (against a relay in
the sandbox copying every byte over a Unix socket, one process and two socket hops fewer per
byte), and from the listener on it accepts the sandbox's next connections directly, so pid 1 is
no longer woken per connection: one process fewer in every connection's setup. The listener
is held as long as its channel: the agent takes it back when the channel closes (the proxy's
socket replaced), and the proxy lets it go when the agent ends (the sandbox's network namespace
is not kept alive by the gateway).

Why the checks: the workload can connect to the same Unix socket and send any descriptor. A
channel is served only when its peer is the sandbox's agent: pid 1 of a pid namespace one level
below the gateway's (the workload cannot make a pid namespace: seccomp refuses it). That matters
beyond what a descriptor is: a socket the workload handed over while keeping a copy shares its
file flags, and with O_NONBLOCK cleared on the copy the gateway's one event loop would block in a
send. The agent's accepted sockets were never the workload's (nor its listener: pid 1 is
undumpable and the listener is close-on-exec). Every received descriptor is still checked (a
connected TCP socket for b"C"; for b"L" a listening TCP socket bound to loopback, in a network
namespace other than the gateway's own, one per channel) and anything else closed and counted;
a refused listener closes its channel, so the agent takes it back rather than wait on it.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import ipaddress
import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path

from warmshell.gateway import metrics

__all__ = ["Listener", "PeerCheck", "check_listener", "check_socket", "is_sandbox_agent", "streams"]

RECORD = b"C"
LISTENER_RECORD = b"L"
_FD_BYTES = array.array("i").itemsize
# Room for one descriptor: a record with more arrives truncated (MSG_CTRUNC; the kernel closes
# what did not fit) or with several in the room the alignment leaves; either is refused.
_CONTROL_BYTES = socket.CMSG_SPACE(_FD_BYTES)
_STEPS = 16  # records per readiness event, so one busy sandbox does not hold the loop
_BACKLOG = 64
_PAUSE_SECONDS = 0.1  # after an accept failed for want of descriptors or memory
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5; Python 3.11 does not name it
_SIOCGSKNS = 0x894C  # a socket's network namespace, as a new descriptor (Linux 4.9)

# Whether a connected channel's peer may hand sockets over (see `is_sandbox_agent`).
PeerCheck = Callable[[socket.socket], bool]


def _count(result: str) -> None:
    metrics.EGRESS_HANDOFFS.labels(result=result).inc()


def _nspid(status: str) -> list[int]:
    """The NSpid line of a /proc status or pidfd fdinfo text: the process's pid in each pid
    namespace it is in, outermost first ([] without one, or for a pidfd of an ended process)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return [int(pid) for pid in line.split()[1:] if pid.lstrip("-").isdigit() and int(pid) > 0]
    return []


def _peer_nspid(channel: socket.socket) -> list[int]:
    """The connected peer's pids by namespace: through a pidfd of the very process that
    connected (SO_PEERPIDFD: no pid that could be reused meanwhile), else its pid's /proc."""
    try:
        pidfd = channel.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError:
        credentials = channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        pid, _, _ = _UCRED.unpack(credentials)
        return _nspid(Path(f"/proc/{pid}/status").read_text())
    try:
        return _nspid(Path(f"/proc/self/fdinfo/{pidfd}").read_text())
    finally:
        os.close(pidfd)


_OWN_DEPTH = len(_nspid(Path("/proc/self/status").read_text()))


def is_sandbox_agent(channel: socket.socket) -> bool:
    """Whether the channel's peer is pid 1 of a pid namespace just below the gateway's: a local
    sandbox's agent (bwrap --as-pid-1), and not its workload, whose pids are above 1 there."""
    try:
        pids = _peer_nspid(channel)
    except (OSError, ValueError):
        return False
    return len(pids) == _OWN_DEPTH + 1 and pids[-1] == 1


def check_socket(fd: int) -> socket.socket | str:
    """The received descriptor `fd` as a connected TCP socket the proxy may serve, or why not
    (then `fd` is closed). Only the descriptor is looked at (fstat, getsockopt): no path."""
    # OSError past the type: ENOTCONN from getpeername (never connected, or still connecting).
    return _checked(fd, _socket_problem, "not_connected")


def check_listener(fd: int) -> socket.socket | str:
    """The received descriptor `fd` as a listening TCP socket on loopback in a network namespace
    other than the gateway's (a sandbox's), or why not (then `fd` is closed)."""
    return _checked(fd, _listener_problem, "not_listening")


def _checked(fd: int, problem_of: Callable[[socket.socket], str | None], failed: str) -> socket.socket | str:
    """`fd` as a non-blocking socket when it is one and `problem_of` finds nothing wrong with it
    (`failed` when that raised OSError); else why not, and `fd` closed."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            return "not_socket"
        made = socket.socket(fileno=fd)  # reads the family, type and protocol from the socket
    except OSError:  # an O_PATH descriptor of a socket file: a socket's mode, no socket
        os.close(fd)
        return "not_socket"
    try:
        problem = problem_of(made)
    except OSError:
        problem = failed
    if problem is not None:
        made.close()
        return problem
    made.setblocking(False)
    return made


def _tcp(made: socket.socket) -> bool:
    # SCTP's stream sockets are SOCK_STREAM too: the protocol says TCP.
    return (
        made.family in (socket.AF_INET, socket.AF_INET6)
        and made.type == socket.SOCK_STREAM
        and made.proto == socket.IPPROTO_TCP
    )


def _listener_problem(made: socket.socket) -> str | None:
    if not _tcp(made):
        return "not_tcp"
    if not made.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "not_listening"
    if not ipaddress.ip_address(made.getsockname()[0]).is_loopback:
        return "not_loopback"
    # A listener of the gateway's own namespace would take the host's connections as the
    # sandbox's. Unknown (the ioctl refused: no CAP_NET_ADMIN over that namespace) is refused too.
    try:
        namespace = fcntl.ioctl(made.fileno(), _SIOCGSKNS)
    except OSError:
        return "unknown_netns"
    try:
        return "own_netns" if _identity(os.fstat(namespace)) == _OWN_NETNS else None
    finally:
        os.close(namespace)


def _identity(found: os.stat_result) -> tuple[int, int]:
    return found.st_dev, found.st_ino


_OWN_NETNS = _identity(os.stat("/proc/self/ns/net"))


def _socket_problem(made: socket.socket) -> str | None:
    if not _tcp(made):
        return "not_tcp"
    if made.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "not_connected"
    made.getpeername()
    return None


class Listener:
    """One sandbox's hand-off socket at `path`: each descriptor that passes `check_socket`, from
    a channel whose peer passes `peer`, goes to `accept` (which then owns it), and so does each
    connection accepted on a listener that passed `check_listener` (one per channel, held while
    the channel is). At most `channels` channels are served at once; records are read, and
    connections accepted, `_STEPS` per readiness event."""

    def __init__(
        self, path: Path, accept: Callable[[socket.socket], None], *, channels: int, peer: PeerCheck = is_sandbox_agent
    ) -> None:
        """Bind and listen at `path` (OSError when it cannot be made)."""
        self._loop = asyncio.get_running_loop()
        self._accept, self._peer, self._max_channels = accept, peer, channels
        self._channels: dict[int, socket.socket] = {}
        self._listeners: dict[int, socket.socket] = {}  # by the channel that handed it
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._socket.setblocking(False)
            self._socket.bind(str(path))
            # The directory (bound into this sandbox alone) is what keeps others out.
            os.chmod(path, 0o666)
            self._socket.listen(_BACKLOG)
        except OSError:
            self._socket.close()
            raise
        self._loop.add_reader(self._socket.fileno(), self._connected)

    def close(self) -> None:
        """Stop listening and close every channel (records not yet read go with them)."""
        if self._socket.fileno() >= 0:
            self._loop.remove_reader(self._socket.fileno())
            self._socket.close()
        for fd in list(self._channels):
            self._drop(fd)

    def _connected(self) -> None:
        for _ in range(_STEPS):
            try:
                channel, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors or memory: a pause, not a spin on a readable socket
                self._loop.remove_reader(self._socket.fileno())
                self._loop.call_later(_PAUSE_SECONDS, self._resume)
                return
            if len(self._channels) >= self._max_channels or not self._peer(channel):
                _count("refused_channel")
                channel.close()
                continue
            channel.setblocking(False)
            self._channels[channel.fileno()] = channel
            self._loop.add_reader(channel.fileno(), self._readable, channel.fileno())

    def _resume(self) -> None:
        if self._socket.fileno() >= 0:
            self._loop.add_reader(self._socket.fileno(), self._connected)

    def _drop(self, fd: int) -> None:
        """Close a channel and the listener it handed (the agent takes its own copy back)."""
        channel = self._channels.pop(fd, None)
        if channel is not None:
            self._loop.remove_reader(fd)
            channel.close()
        listener = self._listeners.pop(fd, None)
        if listener is not None:
            self._loop.remove_reader(listener.fileno())
            listener.close()

    def _readable(self, fd: int) -> None:
        channel = self._channels.get(fd)
        for _ in range(_STEPS):
            if channel is None:
                return
            try:
                data, ancillary, flags, _ = channel.recvmsg(len(RECORD) + 1, _CONTROL_BYTES, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop(fd)
                return
            fds = _descriptors(ancillary)
            if not data and not fds:  # the agent closed it
                self._drop(fd)
                return
            problem = _record_problem(data, fds, flags)
            if problem is not None:
                for received in fds:
                    os.close(received)
                _count(problem)
                continue
            if data == LISTENER_RECORD:
                self._listen(fd, fds[0])
                channel = self._channels.get(fd)  # None: refused, and the channel closed with it
                continue
            checked = check_socket(fds[0])
            if isinstance(checked, str):
                _count(checked)
                continue
            _count("accepted")
            self._accept(checked)

    def _listen(self, channel: int, fd: int) -> None:
        """Accept on the listener the channel's agent handed over (received as `fd`). Refused,
        the channel is closed too: the agent then takes its listener back, where it would wait
        for a gateway that never accepts."""
        checked = "many_listeners" if channel in self._listeners else check_listener(fd)
        if isinstance(checked, str):
            if channel in self._listeners:
                os.close(fd)
            _count(checked)
            self._drop(channel)
            return
        _count("listener")
        self._listeners[channel] = checked
        self._loop.add_reader(checked.fileno(), self._acceptable, channel)

    def _acceptable(self, channel: int) -> None:
        listener = self._listeners.get(channel)
        for _ in range(_STEPS):
            if listener is None:
                return
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError:  # out of descriptors or memory: a pause, as for the channels
                self._loop.remove_reader(listener.fileno())
                self._loop.call_later(_PAUSE_SECONDS, self._resume_listener, channel, listener)
                return
            connection.setblocking(False)
            self._accept(connection)
            listener = self._listeners.get(channel)  # `accept` may have closed this sandbox's proxy

    def _resume_listener(self, channel: int, listener: socket.socket) -> None:
        if self._listeners.get(channel) is listener:
            self._loop.add_reader(listener.fileno(), self._acceptable, channel)


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """Every descriptor a record carried (each SCM_RIGHTS item, whole ones only)."""
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % _FD_BYTES])
    return list(fds)


def _record_problem(data: bytes, fds: list[int], flags: int) -> str | None:
    """What is wrong with a received record (None: one RECORD or LISTENER_RECORD with one
    descriptor)."""
    if flags & socket.MSG_CTRUNC or len(fds) > 1:
        return "many_fds"
    if flags & socket.MSG_TRUNC or data not in (RECORD, LISTENER_RECORD):
        return "bad_record"
    if not fds:
        return "no_fd"
    return None


async def streams(connection: socket.socket, limit: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A handed-over socket as a server's accepted connection (`asyncio.open_connection` would
    make it a client's, whose `start_tls` then takes the client's side of TLS)."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = loop.create_future()
    reader = asyncio.StreamReader(limit=limit)
    protocol = asyncio.StreamReaderProtocol(reader, lambda r, w: made.set_result((r, w)))
    await loop.connect_accepted_socket(lambda: protocol, sock=connection)
    return await made
