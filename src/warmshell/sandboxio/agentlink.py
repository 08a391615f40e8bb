"""The host end of one sandbox's control socket: start commands through its agent, stream their
output, learn their end.

This is the agent-backed implementation of the process seam (`sandboxio.processes.Runner`): the host
creates the pipes, keeps the read ends of stdout/stderr and the write end of stdin, and passes
the other ends to the agent with the EXEC record; output therefore never passes through the
sandbox's pid 1. A timeout or a cancel sends SIGNAL(SIGKILL) to the command's process group; the
status comes from EXITED, which also ends the exec (with the output queued by then) even while a
background child still holds the command's stdout. When the socket closes (the sandbox died)
every pending exec fails.

An interactive exec (`io`) keeps the write end of stdin and feeds it as input arrives; one on a
terminal gets a pseudo-terminal of the sandbox's own devpts (opened by `open_terminal`), whose
slave is sent as all three fds with an EXEC_TTY record, so that the agent makes it the command's
controlling terminal; the host keeps the master.

`open_root` asks the agent for an fd on its root directory: where a pod's supervisor, in another
container, serves file operations (`sandboxio.rootfs` under it, as the local driver does under
`/proc/<agent pid>/root`). The fd is checked to be a directory outside /proc and /sys; any other
fd attached to a reply is a protocol error.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from warmshell.sandboxio import agentwire, processes, rootfs
from warmshell.sandboxio.agentwire import Kind, Reply, Stage
from warmshell.sandboxio.interactive import ExecInput, pump_fd, set_window_size, write_stdin
from warmshell.sandboxio.processes import Ended, NotStarted, OutputSink, WorkdirError

__all__ = ["AgentError", "AgentLink"]

_log = logging.getLogger(__name__)
_NO_STATUS = 255  # an exit status the agent reported that is no wait status at all


class AgentError(OSError):
    """The agent refused a record, or the sandbox is gone."""


@dataclass
class _Exec:
    started: asyncio.Future[Reply] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    exited: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class AgentLink:
    """One control socket (non-blocking), read by the event loop."""

    def __init__(self, sock: socket.socket, open_terminal: Callable[[], tuple[int, int]] | None = None) -> None:
        """`open_terminal` returns a new (master, slave) pseudo-terminal pair inside the
        sandbox; without it, commands cannot run on a terminal."""
        self.open_terminal = open_terminal
        sock.setblocking(False)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._hello: asyncio.Future[int] = self._loop.create_future()
        self._execs: dict[int, _Exec] = {}
        self._next_id = 1
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._next_ping = 1
        self._roots: dict[int, asyncio.Future[int]] = {}
        self._next_root = 1
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(sock.fileno(), self._readable)

    async def wait_hello(self) -> int:
        """The agent's pid (in its namespace) once it said hello; AgentError if it died first."""
        return await asyncio.shield(self._hello)

    def close(self) -> None:
        """Close the socket: the agent kills everything in the sandbox and exits."""
        self._fail(AgentError(errno.EPIPE, "the sandbox's control socket was closed"))

    async def finish(self) -> None:
        """Tell the agent the sandbox is over (it exits 0, not as for a lost supervisor), then
        close the socket."""
        with contextlib.suppress(OSError):
            await self._send(agentwire.encode_finish(), ())
        self.close()

    async def ping(self, timeout: float) -> bool:  # noqa: ASYNC109 - the probe's own bound
        """Whether the agent answers a PING within `timeout` seconds (a stopped or hung agent,
        or a sandbox that has ended, does not)."""
        ping_id, answered = self._next_ping, self._loop.create_future()
        self._next_ping = self._next_ping % 0xFFFFFFFF + 1
        self._pings[ping_id] = answered
        try:
            async with asyncio.timeout(timeout):
                await self._send(agentwire.encode_ping(ping_id), ())
                await answered
            return True
        except (TimeoutError, OSError):
            return False
        finally:
            self._pings.pop(ping_id, None)

    async def open_root(self) -> int:
        """A new O_PATH fd on the agent's root directory (the caller closes it); AgentError when
        the agent cannot open it or the sandbox is gone, or the fd is no plain directory."""
        request_id = self._next_root
        answered: asyncio.Future[int] = self._loop.create_future()
        self._next_root = self._next_root % 0xFFFFFFFF + 1
        self._roots[request_id] = answered
        try:
            await self._send(agentwire.encode_root(request_id), ())
            fd = await answered
        except BaseException:
            if answered.done() and not answered.cancelled() and answered.exception() is None:
                os.close(answered.result())  # answered, but the caller was cancelled meanwhile
            raise
        finally:
            self._roots.pop(request_id, None)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise AgentError(errno.ENOTDIR, "the sandbox's agent sent a root that is no directory")
            rootfs.check_fs(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- the supervisor's process seam -------------------------------------------------------

    async def run_streaming(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        sink: OutputSink,
        stdin: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - a per-command limit, enforced with asyncio.timeout
        io: ExecInput | None = None,
    ) -> Ended:
        """Run `command` in the sandbox and stream its output to `sink`; how it ended. `io`: see
        `Runner`. NotStarted when it cannot be started (WorkdirError: its workdir cannot be
        entered); OSError when the sandbox is gone."""
        exec_id, running = self._next_id, _Exec()
        self._next_id += 1
        tty = io is not None and io.terminal is not None
        try:
            record = agentwire.encode_exec(exec_id, command, env, cwd, tty=tty)
        except agentwire.WireError as exc:
            # The command never started, as execve's E2BIG says for an argv + environment too
            # large: a failure the caller reports (an exec would otherwise never end).
            raise OSError(errno.E2BIG, str(exc)) from None
        ours, reply = await self._start(exec_id, running, record, stdin, io)
        if reply.kind is not Kind.STARTED:
            _close(*ours)
            raise _not_started(reply, command, cwd)
        in_write = ours[0]
        feeding, pumps = self._pump(exec_id, ours, stdin, io, sink, running.exited, tty=tty)
        try:
            async with asyncio.timeout(timeout):
                with contextlib.suppress(OSError):  # the sandbox ended: its output ends too, then raised
                    await asyncio.shield(running.exited)
                await pumps
                status = await asyncio.shield(running.exited)
        except TimeoutError:
            await self._kill(exec_id, running, pumps)
            return processes.timed_out()
        except asyncio.CancelledError:
            await self._kill(exec_id, running, pumps)
            raise
        finally:
            if feeding is not None:
                feeding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeding
            if tty:
                os.close(in_write)
        return status_ended(status)

    async def _start(
        self, exec_id: int, running: _Exec, record: bytes, stdin: bytes, io: ExecInput | None
    ) -> tuple[tuple[int, int, int], Reply]:
        """Send the EXEC record with the command's three fds: the host's ends (see `_stdio`) and
        the agent's answer."""
        ours, theirs = self._stdio(stdin, io)
        sent = False
        try:
            self._execs[exec_id] = running
            await self._send(record, theirs)
            sent = True
            reply = await asyncio.shield(running.started)  # a cancel must not cancel the record
        except BaseException:
            if sent:
                # Cancelled while the agent starts it: its answers must still find the exec (an
                # unknown one would end the sandbox), and a started command is killed then.
                running.started.add_done_callback(lambda started: self._abandon(exec_id, started))
            else:
                self._execs.pop(exec_id, None)
            _close(*ours)
            raise
        finally:
            _close(*set(theirs))  # the agent has its copies (or never will)
        return ours, reply

    def _pump(
        self,
        exec_id: int,
        ours: tuple[int, int, int],
        stdin: bytes,
        io: ExecInput | None,
        sink: OutputSink,
        ended: asyncio.Future[int],
        *,
        tty: bool,
    ) -> tuple[asyncio.Future[None] | None, asyncio.Future[list[None]]]:
        """Start feeding a started command's input and pumping its output into `sink`: the
        feeder (None without one) and the pumps, which end with the command's exit (`ended`),
        with what it wrote: not when every process that inherited its stdout closed it (see
        `pump_fd`)."""
        in_write, out_read, err_read = ours
        feeding: asyncio.Future[None] | None = None
        if io is not None:
            io.feed(stdin, credited=False)
            kill = functools.partial(self._signal, exec_id)
            feeding = asyncio.ensure_future(io.serve(in_write, kill=kill))
        if tty:
            work = [asyncio.ensure_future(pump_fd(in_write, False, sink, close=False, ended=ended))]
        else:
            work = [
                asyncio.ensure_future(pump_fd(out_read, False, sink, ended=ended)),
                asyncio.ensure_future(pump_fd(err_read, True, sink, ended=ended)),
            ]
            if io is None and in_write >= 0:
                # Not one of the pumps: it ends with the command (see `write_stdin`).
                feeding = asyncio.ensure_future(write_stdin(in_write, stdin))
        return feeding, asyncio.gather(*work)

    def _stdio(self, stdin: bytes, io: ExecInput | None) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """The host's ends (stdin's write end or a terminal's master, stdout's and stderr's read
        ends; -1 where none) and the command's three fds."""
        if io is not None and io.terminal is not None:
            if self.open_terminal is None:
                raise AgentError(errno.ENOTTY, "this sandbox cannot run commands on a terminal")
            master, slave = self.open_terminal()
            set_window_size(master, io.terminal)
            return (master, -1, -1), (slave, slave, slave)
        in_read, in_write = os.pipe() if stdin or io is not None else (os.open(os.devnull, os.O_RDONLY), -1)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        return (in_write, out_read, err_read), (in_read, out_write, err_write)

    def _signal(self, exec_id: int, signo: int) -> None:
        """Send SIGNAL(signo) for an exec (in the background; a sandbox that ended has no one to signal)."""
        task = asyncio.ensure_future(self._send(agentwire.encode_signal(exec_id, signo), ()))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    def _abandon(self, exec_id: int, started: asyncio.Future[Reply]) -> None:
        if not started.cancelled() and started.exception() is None and started.result().kind is Kind.STARTED:
            self._signal(exec_id, signal.SIGKILL)

    async def _kill(self, exec_id: int, running: _Exec, pumps: asyncio.Future[list[None]]) -> None:
        with contextlib.suppress(OSError):
            await self._send(agentwire.encode_signal(exec_id, signal.SIGKILL), ())
        pumps.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await pumps
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(running.exited), 5.0)

    # -- the socket --------------------------------------------------------------------------

    async def _send(self, record: bytes, fds: Sequence[int]) -> None:
        while True:
            if self.closed.done():
                raise AgentError(errno.EPIPE, "the sandbox has ended")
            try:
                socket.send_fds(self._sock, [record], list(fds))
                return
            except BlockingIOError:
                writable = self._loop.create_future()
                self._loop.add_writer(self._sock.fileno(), writable.set_result, None)
                try:
                    await asyncio.wait([writable, self.closed], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._loop.remove_writer(self._sock.fileno())
            except OSError as exc:
                self._fail(AgentError(exc.errno, f"the sandbox's control socket failed: {exc}"))
                raise AgentError(errno.EPIPE, "the sandbox has ended") from exc

    def _readable(self) -> None:
        while not self.closed.done():
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, agentwire.REPLY_SIZE + 1, 1, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._fail(AgentError(exc.errno, f"the sandbox's control socket failed: {exc}"))
                return
            if not data:
                _close(*fds)
                self._fail(AgentError(errno.EPIPE, "the sandbox has ended"))
                return
            try:
                if flags & socket.MSG_CTRUNC:
                    raise agentwire.WireError("a record with more than one fd")
                reply = agentwire.decode_reply(data)
                if reply.kind is Kind.ROOT_DIR:
                    self._root_dir(reply, fds)
                    fds = []
                elif fds:
                    raise agentwire.WireError(f"an fd attached to a {reply.kind.name} record")
                else:
                    self._dispatch(reply)
            except agentwire.WireError as exc:
                _close(*fds)
                _log.warning("sandbox agent broke the protocol (%s); ending the sandbox", exc)
                self._fail(AgentError(errno.EPROTO, f"the sandbox's agent broke the protocol: {exc}"))

    def _root_dir(self, reply: Reply, fds: list[int]) -> None:
        """A ROOT_DIR answer: exactly one fd and no errno, or an errno and no fd. One for a
        request given up already (cancelled) arrives late, never unasked-for."""
        answered = self._roots.get(reply.exec_id)
        if reply.b or (len(fds) == 1) == bool(reply.a) or not 0 < reply.exec_id < self._next_root:
            raise agentwire.WireError(f"a malformed or unasked-for ROOT_DIR record ({reply.exec_id})")
        if answered is None or answered.done():
            _close(*fds)
        elif reply.a:
            answered.set_exception(
                AgentError(reply.a, f"the sandbox's agent cannot open its root: {os.strerror(reply.a)}")
            )
        else:
            answered.set_result(fds[0])

    def _dispatch(self, reply: Reply) -> None:
        if reply.kind is Kind.HELLO:
            if self._hello.done() or reply.b != agentwire.VERSION:
                raise agentwire.WireError(f"unexpected hello (version {reply.b})")
            self._hello.set_result(reply.a)
            return
        if reply.kind is Kind.PONG:
            answered = self._pings.get(reply.exec_id)
            if answered is None:
                # A PONG for a probe that timed out already arrives late, never unasked-for.
                if not 0 < reply.exec_id < self._next_ping or reply.a or reply.b:
                    raise agentwire.WireError(f"a PONG for a ping never sent ({reply.exec_id})")
            elif not answered.done():
                answered.set_result(None)
            return
        running = self._execs.get(reply.exec_id)
        if running is None or not self._hello.done():
            raise agentwire.WireError(f"a {reply.kind.name} record for unknown exec {reply.exec_id}")
        if reply.kind is Kind.EXITED:
            if not running.started.done() or running.started.result().kind is not Kind.STARTED:
                raise agentwire.WireError(f"exec {reply.exec_id} ended before it started")
            del self._execs[reply.exec_id]
            running.exited.set_result(reply.a)
        elif running.started.done():
            raise agentwire.WireError(f"a second {reply.kind.name} record for exec {reply.exec_id}")
        else:
            running.started.set_result(reply)
            if reply.kind is not Kind.STARTED:
                del self._execs[reply.exec_id]

    def _fail(self, error: AgentError) -> None:
        if self.closed.done():
            return
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self.closed.set_result(None)
        pending = (f for e in self._execs.values() for f in (e.started, e.exited))
        for future in (self._hello, *pending, *self._pings.values(), *self._roots.values()):
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here, so an exec nobody awaits logs nothing
        self._execs.clear()


def status_ended(status: int) -> Ended:
    """How a command ended, from the wait status the agent reported."""
    try:
        return processes.ended(os.waitstatus_to_exitcode(status))
    except ValueError:
        return Ended(_NO_STATUS)


def _not_started(reply: Reply, command: Sequence[str], cwd: str) -> OSError:
    """What to raise for the agent's answer to an EXEC that did not start the command."""
    if reply.kind is Kind.REJECTED:
        return AgentError(errno.EINVAL, f"the sandbox's agent rejected the command (reason {reply.a})")
    error = reply.b
    if reply.a == Stage.CHDIR:
        return WorkdirError(error, cwd)
    if reply.a != Stage.EXEC:
        return OSError(error, f"cannot start a process in the sandbox: {os.strerror(error)}")
    return NotStarted(error, command[0])


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)
