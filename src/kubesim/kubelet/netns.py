"""Pod network namespaces: a pod that serves ports gets its own, so that two pods (or a pod and
anything else on this machine) can both listen on ``0.0.0.0:7443``, as in a real cluster.

A holder process (``python -m kubesim.kubelet.mountns --hold-netns``) creates the namespace with
only a loopback interface and sleeps; the pod's containers join it. kubesim reaches into it by
creating sockets there (``socket_in``): ``setns`` on a worker thread, which switches that thread
only, and a socket keeps the namespace it was made in. Nothing leaves the machine: a pod's
namespace has no interface but ``lo``.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubesim-netns")
_home: dict[int, int] = {}
_lock = threading.Lock()


def loopback_up() -> None:
    """Bring ``lo`` up in the current network namespace (a new one starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def unshare_net() -> None:
    """Move the calling process into a new network namespace with ``lo`` up."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    loopback_up()


def enter(path: str) -> None:
    """Join the network namespace at ``path`` (``/proc/<pid>/ns/net``) with the calling thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _make(path: str, bind: tuple[str, int] | None) -> socket.socket:
    with _lock:
        ident = threading.get_ident()
        if ident not in _home:
            _home[ident] = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    enter(path)
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if bind is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(bind)
                sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock
    finally:
        libc.setns(_home[ident], CLONE_NEWNET)


async def socket_in(path: str, *, bind: tuple[str, int] | None = None) -> socket.socket:
    """A TCP socket in the namespace at ``path``; listening on ``bind`` when given."""
    made = asyncio.get_running_loop().run_in_executor(_executor, _make, path, bind)
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:
        # The caller gave up (a probe's timeout): close the socket once the thread has made it.
        made.add_done_callback(_close_result)
        raise


def _close_result(made: asyncio.Future[socket.socket]) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().close()


async def open_connection(path: str | None, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to ``host:port`` as seen from the namespace at ``path`` (the host's when None)."""
    if path is None:
        return await asyncio.open_connection(host, port)
    sock = await socket_in(path)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)
