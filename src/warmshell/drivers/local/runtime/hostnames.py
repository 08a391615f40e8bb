"""Renames a running sandbox: warm members start with their instance id as hostname, and the
claim gives them the sandbox's name, as a cold sandbox has from the start.

The sandbox cannot do it itself (bwrap drops every capability), so the gateway joins the
sandbox's UTS namespace, sets the name, and joins its own again: three syscalls, ~7 us, done
inline on the event-loop thread because a hop to a worker thread costs milliseconds on a busy
host (setns moves only the calling thread, and nothing else runs on it in between). The
sandbox's namespace is reached through a pidfd and the thread's own is opened once; the
syscalls are made holding the GIL (they take microseconds), since a thread that lets it go in
a busy gateway waits for the spawner or the store thread to hand it back. When that is refused
it tries `nsenter -U -u ... hostname NAME` (~2 ms). An unprivileged gateway gets
neither (bwrap nests the sandbox's user namespace below the one owning its UTS namespace), so
after the first failure it stops trying and warm sandboxes keep their instance id as hostname:
a convenience lost, not an identity (logged once).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os

__all__ = ["HostnameSetter"]

_log = logging.getLogger(__name__)
_CLONE_NEWUTS = 0x04000000
_CHILD_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


class _StrandedError(OSError):
    """The thread could not return to its own UTS namespace."""


def _check(result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class HostnameSetter:
    """Sets hostnames of sandboxes from the outside."""

    def __init__(self) -> None:
        self._libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: calls keep the GIL
        self._own: int | None = None  # the event-loop thread's own UTS namespace, once opened
        self._disabled = False

    async def set(self, pid: int, name: str) -> None:
        """Set the hostname of the UTS namespace process `pid` lives in (best effort)."""
        if self._disabled:
            return
        try:
            self._set_nowait(pid, name)
            return
        except _StrandedError:
            raise
        except OSError as exc:
            _log.debug("setns into %d failed (%s); trying nsenter", pid, exc)
        await self._nsenter(pid, name)

    def _set_nowait(self, pid: int, name: str) -> None:
        libc = self._libc
        if self._own is None:
            self._own = os.open("/proc/thread-self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
        target = os.pidfd_open(pid)
        try:
            _check(libc.setns(target, _CLONE_NEWUTS))
        finally:
            os.close(target)
        try:
            encoded = name.encode()
            _check(libc.sethostname(encoded, len(encoded)))
        finally:
            if libc.setns(self._own, _CLONE_NEWUTS) != 0:
                # Cannot happen when the first setns was allowed; if it does, this thread
                # would report the sandbox's hostname as its own: fail loudly.
                raise _StrandedError(ctypes.get_errno(), "cannot rejoin the gateway's UTS namespace")

    async def _nsenter(self, pid: int, name: str) -> None:
        argv = ["nsenter", "--preserve-credentials", "-t", str(pid)]
        # Root may join the UTS namespace from outside; joining the sandbox's user namespace
        # first would leave it with capabilities only there, below the UTS namespace's owner.
        if os.geteuid() != 0 and _user_ns(pid) != _user_ns(os.getpid()):
            argv.append("-U")
        argv += ["-u", "hostname", name]
        try:
            # Its own environment, not the gateway's (which may hold the store's password).
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=_CHILD_ENV
            )
            _, err = await process.communicate()
            problem = err.decode().strip() if process.returncode != 0 else ""
        except OSError as exc:
            problem = str(exc)
        if problem:
            self._disabled = True
            _log.warning(
                "cannot rename sandboxes (%s); warm sandboxes keep their instance id as hostname",
                problem,
            )


def _user_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return ""
