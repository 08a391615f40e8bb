"""`warmshell supervisor`: the entry point of every sandbox.

0. Make the process non-dumpable, before any secret is in its memory: on Kubernetes the workload
   runs beside it as the same uid, and would otherwise read `/proc/<pid>/mem` and `environ`
   (the credential, the sandbox token) or ptrace it. Its children are dumpable again (execve
   resets the flag), so workloads are not affected.
1. Read the bootstrap credential (a one-time pipe from the local driver, or a projected token file
   on Kubernetes) and scrub every WARMSHELL_* variable from the environment.
2. RegisterSupervisor, retrying at once and then 1 s -> 30 s while the gateway is unreachable, and wait — a warm
   pool member waits here until a create selects it. Once activated the credential is dropped
   (a restarted supervisor reads it again from its file).
3. Start the workload from the activation, then hold the session: heartbeats, exec relay,
   workload output and exit; reconnect (ConnectSupervisor) when the gateway restarts; refresh
   the token at 80 %. Over gRPC, steps 2 and 3 begin on one stream (OpenSupervisor: the
   registration up, the activation down, then the hello and the session), falling back to
   RegisterSupervisor and ConnectSupervisor on a gateway that answers UNIMPLEMENTED.

On Kubernetes (`WARMSHELL_AGENT_SOCKET` set) the workload is another container of the pod, whose
pid 1 is the sandbox agent: before registering, the supervisor accepts that agent's one connection
on the socket (`sandboxio.agentlisten`), and the workload command and every exec run through it
(`sandboxio.agentlink`), as the local driver's do. If the agent goes (the workload container
ended: its pid 1 was killed, or it ran out of memory), an activated sandbox's workload has ended
(exit 137 when there was no command, else its command's failure is reported); one not activated
yet stops this supervisor with an error, so the kubelet starts both again.

Exit status. By default (`WARMSHELL_RESTART_POLICY` unset or `Never`, the local driver) the
supervisor exits with the workload's status when it ran. Under `OnFailure` (the Kubernetes pod
policy, set in the rendered env) a non-zero exit makes the kubelet run the supervisor again, so it
exits 0 whenever the gateway has ended its part — the workload's status is already recorded
there — and also when the gateway refuses it because the sandbox is over (Error, Deleting, gone):
a workload that failed is never run again. Any other failure (a crash, SIGKILL, OOM, a refused
credential) is non-zero and restarts it; the restarted supervisor registers again with the same
pod credential and, while its sandbox is still live, is activated again and starts the workload
from the activation again, as a restarted container runs its command again (the old workload died
with the container).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

import grpc

from warmshell.api.v1 import outcome_pb2 as opb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core import egress
from warmshell.sandboxio import terminals, trust
from warmshell.sandboxio.agentlink import AgentLink
from warmshell.sandboxio.agentlisten import accept_agent
from warmshell.sandboxio.interactive import DEFAULT_SIZE, ExecInput, WindowSize
from warmshell.sandboxio.link import GatewayLink, GrpcLink, SessionCall, SessionOpener
from warmshell.sandboxio.processes import Ended, NotStarted, OutputSink, Runner, StartFailure
from warmshell.sandboxio.window import OutputWindow
from warmshell.supervisor.background import BackgroundExecs
from warmshell.supervisor.backoff import reconnect_delays
from warmshell.supervisor.fileops import FileServer
from warmshell.supervisor.outbox import Outbox

__all__ = ["Supervisor", "SupervisorSettings", "main"]

log = logging.getLogger("warmshell.supervisor")

ENV_PREFIX = "WARMSHELL_"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
TOKEN_REFRESH_FRACTION = 0.8
# How long the workload container's agent may take to connect: its image is pulled and its
# container started beside this one (the kubelet starts them one after the other, not waiting).
AGENT_CONNECT_SECONDS = 300.0
# The status of a workload whose container ended under it (as a container killed by SIGKILL).
EXIT_AGENT_LOST = 137
# The restart policies a supervisor can run under (Always would rerun an ended sandbox).
RESTART_POLICIES = ("Never", "OnFailure")
# Beside the agent's socket: where the egress proxy's CA and bundle are put for the workload.
TRUST_DIR = "trust"
# Fatal for a registration: retrying with the same credential cannot succeed.
_FATAL = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED,
          grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT}  # fmt: skip
# What the gateway answers for a sandbox that is over (Error or Deleting; no longer exists).
_SANDBOX_OVER = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}
# The supervisor retries on its own (`backoff.reconnect_delays`), so gRPC's own retries are off.
# With them on, a call started while the gateway's connections are being GOAWAYed (a replica
# shutting down, connections closed as soon as they are made) can be retried "transparently"
# without end and without I/O: every attempt fails at once on a transport already going away,
# and each one stays in the call's memory until the call ends. That spun a core and grew a pod
# supervisor by ~100 MB/s (bench/investigations/supervisor-memory/); with retries off the call fails with
# UNAVAILABLE and the supervisor's backoff takes over.
CHANNEL_OPTIONS = [("grpc.enable_retries", 0)]


PR_SET_DUMPABLE = 4
# The C library this interpreter already has loaded (`ctypes.util.find_library` would run
# `ldconfig -p` in a child process, a fork of the whole supervisor on every pod start), and its
# prctl and the log format made at import: on kubesim the pods' supervisors are forked from one
# that imported this module, and making them in each cost ~0.3 ms of CPU per pod (copies of the
# pages the first call touches).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
_LOG_FORMAT = logging.Formatter("supervisor %(levelname)s %(message)s")

T = TypeVar("T")


def make_undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): no core dumps, and `/proc/<pid>/mem`, `environ` and ptrace are
    closed to other processes of the same uid that lack CAP_SYS_PTRACE. Raises OSError if the
    kernel refuses (the supervisor then does not start: it would hold its secrets in the open)."""
    if _PRCTL(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(code)}")


class SupervisorExit(Exception):
    """Stop the supervisor with this exit status."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class SandboxOver(SupervisorExit):
    """The gateway refused this supervisor because its sandbox is over: a restart cannot help."""


class _NoOpen(Exception):
    """The gateway does not serve OpenSupervisor (an older one): register and connect apart."""


@dataclass
class SupervisorSettings:
    """Where the gateway is and who this supervisor is (read from the environment)."""

    gateway: str
    credential: str = field(repr=False)
    instance_id: str = ""
    # Whether a non-zero exit makes the runtime start this supervisor again (see the module doc).
    restart_on_failure: bool = False
    # Where the workload container's agent connects (Kubernetes); None: this process's children.
    agent_socket: str | None = None  # a str, not a Path: no pathlib among the supervisor's imports

    @classmethod
    def from_environment(cls, environ: dict[str, str]) -> SupervisorSettings:
        """Read and consume the bootstrap credential; the caller scrubs the environment."""
        gateway = environ.get("WARMSHELL_GATEWAY", "")
        if not gateway:
            raise SupervisorExit(2, "WARMSHELL_GATEWAY is not set")
        policy = environ.get("WARMSHELL_RESTART_POLICY") or "Never"
        if policy not in RESTART_POLICIES:
            raise SupervisorExit(2, f"WARMSHELL_RESTART_POLICY must be one of {', '.join(RESTART_POLICIES)}")
        if fd_text := environ.get("WARMSHELL_BOOTSTRAP_FD"):
            fd = int(fd_text)
            with os.fdopen(fd, "rb") as pipe:  # closes the fd: the workload never inherits it
                credential = pipe.read().decode().strip()
        elif path := environ.get("WARMSHELL_BOOTSTRAP_FILE"):
            with open(path) as handle:
                credential = handle.read().strip()
        else:
            raise SupervisorExit(2, "neither WARMSHELL_BOOTSTRAP_FD nor WARMSHELL_BOOTSTRAP_FILE is set")
        if not credential:
            raise SupervisorExit(2, "the bootstrap credential is empty")
        return cls(
            gateway=gateway,
            credential=credential,
            instance_id=environ.get("WARMSHELL_INSTANCE_ID", ""),
            restart_on_failure=policy == "OnFailure",
            agent_socket=environ.get("WARMSHELL_AGENT_SOCKET") or None,
        )


_EXEC_ERRORS = {
    StartFailure.COMMAND_NOT_FOUND: opb.EXEC_ERROR_COMMAND_NOT_FOUND,
    StartFailure.NOT_EXECUTABLE: opb.EXEC_ERROR_NOT_EXECUTABLE,
    StartFailure.WORKDIR: opb.EXEC_ERROR_WORKDIR,
}


def exec_exited(exec_id: str, end: Ended | OSError) -> spb.ExecExited:
    """The message that ends an exec: how it ended, or why it never started (a command that is
    missing or not executable, a workdir that cannot be entered) with the exit status a shell
    gives for that; any other OSError (the sandbox ended under it, a command too large to start)
    fails the exec as a call."""
    if isinstance(end, Ended):
        outcome = opb.ExecOutcome(timed_out=end.timed_out, signal=end.signal)
        return spb.ExecExited(exec_id=exec_id, exit_code=end.exit_code, outcome=outcome)
    if not isinstance(end, NotStarted):
        return spb.ExecExited(exec_id=exec_id, exit_code=-1, error=str(end))
    outcome = opb.ExecOutcome(error=_EXEC_ERRORS[end.failure], error_message=str(end))
    return spb.ExecExited(exec_id=exec_id, exit_code=end.failure.value, outcome=outcome)


def _workload_environment(base: dict[str, str], activation: spb.SupervisorActivationMessage) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(ENV_PREFIX)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", activation.workload.workdir or "/")
    env.update(activation.workload.environment)
    env.update(activation.workload.secrets)
    env["WARMSHELL_SANDBOX_ID"] = activation.sandbox_id
    env["WARMSHELL_SANDBOX_NAME"] = activation.sandbox_name
    return env


class Supervisor:
    """One sandbox's supervisor."""

    def __init__(
        self,
        settings: SupervisorSettings,
        base_env: dict[str, str],
        *,
        runner: Runner | None = None,
        link: GatewayLink | None = None,
        serve_files: bool = False,
        workdir: str = "",
        process_exit_closes_channel: bool = False,
    ) -> None:
        """`runner` starts the workload and execs (the local driver's, through its sandbox's
        agent); without one, `settings.agent_socket` must name where the workload container's
        agent connects (a pod's supervisor), and the agent is the runner;
        `link`, when given, is how to reach the gateway (the local driver runs every sandbox's
        supervisor in the gateway process and passes its in-process link or a shared channel's);
        by default `run` opens a gRPC channel to `settings.gateway` and closes it; `serve_files`:
        answer the gateway's file operations inside this process's filesystem (a pod's
        supervisor; the local driver serves files host-side instead); `workdir`: the workload's
        and execs' directory over the activation's (an image's WorkingDir on the local driver);
        `process_exit_closes_channel`: the caller ends the process as soon as `run` returns
        (`main`), so `run` leaves the gateway channel it made to the exit to close."""
        self.settings = settings
        self._base_env = base_env
        self._default_workdir = workdir
        self._runner = runner
        self._given_link = link
        self._close_channel = not process_exit_closes_channel
        self._outbox = Outbox()
        self._execs: dict[str, asyncio.Task[None]] = {}
        self._windows: dict[str, OutputWindow] = {}
        self._inputs: dict[str, ExecInput] = {}
        self._files = FileServer(self._outbox.put_control, self._open_workload_root) if serve_files else None
        self._workload_root = -1  # the agent's root directory, an O_PATH fd (see `_connect_agent`)
        # Background commands outlive sessions: they and their output are kept here, not per session.
        self._background = BackgroundExecs(self._execute, self._send)
        self._token = ""
        self._token_expires_ms = 0
        self._workload: asyncio.Task[None] | None = None
        self._workload_started = False
        self._exit_code: int | None = None
        self._session_served = False  # the current session got a message from the gateway
        self._agent: AgentLink | None = None
        self._run_task: asyncio.Task[int] | None = None
        self.activation: spb.SupervisorActivationMessage | None = None

    async def run(self) -> int:
        """Register, start the workload, and hold the session until the sandbox ends."""
        # A channel belongs to the running loop, so it is made here rather than in __init__.
        channel: grpc.aio.Channel | None = None
        if self._given_link is not None:
            self._link = self._given_link
        else:
            channel = grpc.aio.insecure_channel(self.settings.gateway, options=CHANNEL_OPTIONS)
            self._link = GrpcLink(channel)
        try:
            if self.settings.agent_socket is not None:
                await self._connect_agent(self.settings.agent_socket)
            elif self._runner is None:
                # Nothing runs in this process's own namespaces: a command started here would
                # share the supervisor's uid, filesystem and credential.
                raise SupervisorExit(2, "WARMSHELL_AGENT_SOCKET is not set: the workload runs only through its agent")
            first = await self._activate()
            # A timer until the first refresh is due, not a task sleeping from the activation on
            # (the local driver runs every supervisor in the gateway: a warm create pays for it).
            refresher: list[asyncio.Task[None]] = []
            timer = asyncio.get_running_loop().call_later(
                self._refresh_delay(), lambda: refresher.append(asyncio.create_task(self._refresh_tokens()))
            )
            try:
                await self._hold_session(first)
            finally:
                timer.cancel()
                for task in refresher:
                    task.cancel()
            await self._finish_agent()
            return self._ended_status(self._exit_code if self._exit_code is not None else 0)
        except SandboxOver as over:
            log.info("supervisor stopping: %s", over)
            await self._finish_agent()
            return self._ended_status(over.code)
        except SupervisorExit as stop:
            log.error("supervisor stopping: %s", stop)
            return stop.code
        finally:
            await self._release(channel)

    async def _take(self, activation: spb.SupervisorActivationMessage) -> None:
        """Take what the activation gives: the token, the workload's environment, trust and
        directory, and its command started (a warm member's starts only here)."""
        # The credential has done its one job; a restarted supervisor reads it again.
        self.settings.credential = ""
        self.activation = activation
        self._token, self._token_expires_ms = activation.token, activation.token_expires_at_ms
        self._env = _workload_environment(self._base_env, activation)
        if activation.workload.trusted_ca:
            self._env |= await self._place_trust(activation.workload.trusted_ca)
        self._workdir = self._default_workdir or activation.workload.workdir or "/"
        if activation.workload.command:
            self._workload = asyncio.create_task(self._run_workload(list(activation.workload.command)))
            self._workload_started = True

    async def _release(self, channel: grpc.aio.Channel | None) -> None:
        """End what `run` started, whichever way it ended: execs, the workload, background
        commands, the agent, the root descriptor and the gateway channel."""
        for task in [*self._execs.values(), *([self._workload] if self._workload else [])]:
            task.cancel()
        await self._background.aclose()
        if self._agent is not None:
            self._agent.closed.remove_done_callback(self._agent_lost)  # our own close is no loss
            self._agent.close()
        if self._workload_root >= 0:
            root, self._workload_root = self._workload_root, -1
            os.close(root)
        if channel is not None and self._close_channel:
            await channel.close(grace=None)

    async def _place_trust(self, ca_pem: bytes) -> dict[str, str]:
        """Make the workload trust the egress proxy's CA (`Workload.trusted_ca`): the CA and a
        bundle of this container's CAs and it, beside the agent's socket (a directory both
        containers mount at one path); the variables that point the workload's tools there.
        Nothing when that fails: its TLS to the secrets' hosts then fails verification, closed."""
        if self.settings.agent_socket is None:
            log.warning("an egress CA to trust, but no workload container to place it in; ignored")
            return {}
        directory = os.path.join(os.path.dirname(self.settings.agent_socket), TRUST_DIR)
        try:
            await asyncio.to_thread(trust.write_trust, directory, ca_pem)
        except OSError as exc:
            log.warning("could not place the egress proxy's CA in %s: %s", directory, exc)
            return {}
        return egress.trust_environment(directory)

    async def _connect_agent(self, path: str) -> None:
        """Take the workload container's agent (see the module doc) as this sandbox's runner."""
        connection = await accept_agent(path, uid=os.geteuid(), timeout=AGENT_CONNECT_SECONDS)
        link = AgentLink(connection, open_terminal=self._open_workload_terminal)
        self._agent = link
        try:
            async with asyncio.timeout(AGENT_CONNECT_SECONDS):
                pid = await link.wait_hello()
                # Files are served in the workload container's filesystem, not this one's (which
                # holds the pod's token): under the agent's root, as the local driver serves
                # them under /proc/<agent pid>/root.
                self._workload_root = await link.open_root()
        except TimeoutError:
            raise SupervisorExit(1, "the workload's agent connected but never said hello") from None
        except OSError as exc:
            raise SupervisorExit(1, f"the workload's agent: {exc}") from exc
        log.info("the workload's agent (pid %d in its container) is connected", pid)
        self._runner = link.run_streaming
        self._run_task = asyncio.current_task()
        link.closed.add_done_callback(self._agent_lost)

    def _open_workload_root(self) -> int:
        """A new fd on the workload container's root (for one file operation; the caller closes it)."""
        if self._workload_root < 0:
            raise OSError(errno.ENODEV, "the workload's agent has not connected")
        return os.dup(self._workload_root)

    def _open_workload_terminal(self) -> tuple[int, int]:
        """A pseudo-terminal (master, slave) of the workload container's own devpts, opened
        through its root: the command's `tty` names a device of its container, and nothing of
        this container's devpts reaches it. The slave stays this process's user's, the
        workload's (the agent connects only as it)."""
        return terminals.open_in_root(self._open_workload_root(), owner_of_root=False)

    async def _finish_agent(self) -> None:
        """The sandbox is over: the workload container ends with status 0 (it is not restarted)."""
        if self._agent is not None:
            self._agent.closed.remove_done_callback(self._agent_lost)
            await self._agent.finish()

    def _agent_lost(self, _: asyncio.Future[None]) -> None:
        """The workload container ended under its agent."""
        if self.activation is None:
            log.error("the workload container ended before this sandbox was activated; stopping")
            if self._run_task is not None:
                self._run_task.cancel()
            return
        log.warning("the workload container ended (its agent's connection closed)")
        if self._workload is None and self._exit_code is None:
            self._exit_code = EXIT_AGENT_LOST
            exited = spb.SupervisorMessage(workload_exited=spb.WorkloadExited(exit_code=EXIT_AGENT_LOST))
            self._workload = asyncio.create_task(self._send(exited))

    def _runner_now(self) -> Runner:
        """The runner, which `run` has ensured before anything can start a command."""
        if self._runner is None:
            raise RuntimeError("no runner before the workload's agent connected")
        return self._runner

    def _ended_status(self, code: int) -> int:
        """The exit status once the gateway has ended this supervisor's part in the sandbox."""
        return 0 if self.settings.restart_on_failure else code

    async def _activate(self) -> SessionCall | None:
        """Register and take the activation. Over a link that can (`SessionOpener`: a pod's), on
        a stream that is then the first session, which is returned: a warm create then costs no
        second call between its activation and Ready. Otherwise (in process, or a gateway older
        than OpenSupervisor) with RegisterSupervisor, and None: the session is opened apart."""
        opener = self._link if isinstance(self._link, SessionOpener) else None
        if opener is not None:
            try:
                return await self._registering(lambda request: self._open(opener, request))
            except _NoOpen:
                log.info("the gateway does not serve OpenSupervisor; registering with RegisterSupervisor")
        await self._take(await self.register())
        return None

    async def _open(self, opener: SessionOpener, request: spb.RegisterSupervisorRequest) -> SessionCall:
        """One OpenSupervisor call, returned once its activation has been taken."""
        taken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        call = opener.open(self._opening(request, taken))
        try:
            first = await anext(aiter(call), None)
            if first is None or not first.HasField("activation"):
                raise SupervisorExit(1, "registration stream ended without an activation")
            await self._take(first.activation)
            taken.set_result(True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise _NoOpen from exc
            raise
        finally:
            if not taken.done():  # the request iterator stops, and the call with it
                taken.set_result(False)
                call.cancel()
        return call

    async def _opening(
        self, request: spb.RegisterSupervisorRequest, taken: asyncio.Future[bool]
    ) -> AsyncIterator[spb.SupervisorMessage]:
        """OpenSupervisor's requests: the registration, then (once the activation has been
        taken) the hello and the session's messages."""
        register = spb.SupervisorMessage(register=request)
        del request  # the credential is not kept for the session's lifetime
        yield register
        del register
        if await taken:
            async for message in self._outbox.stream(self._outbox.new_session(), self._hello()):
                yield message

    async def register(self) -> spb.SupervisorActivationMessage:
        """RegisterSupervisor until an activation arrives (retrying while the gateway is away)."""
        return await self._registering(self._register_once)

    async def _register_once(self, request: spb.RegisterSupervisorRequest) -> spb.SupervisorActivationMessage:
        activation = await self._link.register(request)
        if activation is None:
            raise SupervisorExit(1, "registration stream ended without an activation")
        return activation

    async def _registering(self, attempt: Callable[[spb.RegisterSupervisorRequest], Awaitable[T]]) -> T:
        """`attempt` with this supervisor's registration until it succeeds, retrying while the
        gateway is away; a refusal that retrying cannot mend stops the supervisor."""
        backoff = reconnect_delays()
        request = spb.RegisterSupervisorRequest(bootstrap_credential=self.settings.credential)
        while True:
            try:
                return await attempt(request)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _FATAL:
                    stop = SandboxOver if exc.code() in _SANDBOX_OVER else SupervisorExit
                    raise stop(1, f"registration refused: {exc.code().name}: {exc.details()}") from exc
                delay = next(backoff)
                log.warning("gateway unreachable (%s); registering again in %.2fs", exc.code().name, delay)
                await asyncio.sleep(delay)

    async def _send(self, message: spb.SupervisorMessage) -> None:
        await self._outbox.put(message)

    async def _output(self, exec_id: str, stderr: bool, data: bytes) -> None:
        await self._send(spb.SupervisorMessage(output=spb.OutputData(exec_id=exec_id, stderr=stderr, data=data)))

    async def _run_workload(self, command: list[str]) -> None:
        async def sink(stderr: bool, data: bytes) -> None:
            await self._output("", stderr, data)

        try:
            code = (await self._runner_now()(command, env=self._env, cwd=self._workdir, sink=sink)).exit_code
        except OSError as exc:  # it never started (e.g. too large for the sandbox): its log says why
            await sink(True, f"warmshell: workload: {exc}\n".encode())
            code = exc.failure.value if isinstance(exc, NotStarted) else StartFailure.NOT_EXECUTABLE.value
        self._exit_code = code
        await self._send(spb.SupervisorMessage(workload_exited=spb.WorkloadExited(exit_code=code)))

    async def _run_exec(self, start: spb.ExecStart) -> None:
        window = OutputWindow(start.output_window_bytes) if start.output_window_bytes else None
        if window is not None:
            self._windows[start.exec_id] = window

        async def sink(stderr: bool, data: bytes) -> None:
            if window is None:  # an older gateway: no flow control
                await self._output(start.exec_id, stderr, data)
                return
            view = memoryview(data)
            while view:
                size = await window.take(len(view))
                await self._output(start.exec_id, stderr, bytes(view[:size]))
                view = view[size:]

        try:
            exited = await self._execute(start, sink, self._inputs.get(start.exec_id))
        finally:
            self._execs.pop(start.exec_id, None)
            self._windows.pop(start.exec_id, None)
            self._inputs.pop(start.exec_id, None)
        await self._send(spb.SupervisorMessage(exec_exited=exited))

    async def _execute(self, start: spb.ExecStart, sink: OutputSink, interactive: ExecInput | None) -> spb.ExecExited:
        """Run one exec (in the foreground or the background) to its end."""
        env = {**self._env, **start.environment}
        extra = {"io": interactive} if interactive is not None else {}  # plain runners need not know
        try:
            end = await self._runner_now()(
                list(start.command),
                env=env,
                cwd=start.workdir or self._workdir,
                sink=sink,
                stdin=start.stdin,
                timeout=start.timeout_seconds or None,
                **extra,
            )
            return exec_exited(start.exec_id, end)
        except OSError as exc:  # it never started, or the sandbox ended: never told in its output
            return exec_exited(start.exec_id, exc)

    async def _hold_session(self, first: SessionCall | None) -> None:
        """Hold the session, `first` (opened by the registration) if given, reconnecting with
        ConnectSupervisor until the sandbox is over."""
        backoff = reconnect_delays()
        while True:
            call, first = first, None
            try:
                if await self._session(call):
                    return
                backoff = reconnect_delays()  # a clean reconnect request: start over quickly
                delay = 0.05
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise SandboxOver(1, f"session refused: {exc.details()}") from exc
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise SupervisorExit(1, f"session refused: {exc.details()}") from exc
                if self._session_served:  # an established session was lost: retry at once again
                    backoff = reconnect_delays()
                delay = next(backoff)
                log.warning("session lost (%s); reconnecting in %.2fs", exc.code().name, delay)
            await asyncio.sleep(delay)

    def _hello(self) -> spb.SupervisorMessage:
        """A session's first message."""
        assert self.activation is not None
        return spb.SupervisorMessage(
            hello=spb.SupervisorHello(
                sandbox_id=self.activation.sandbox_id,
                instance_id=self.settings.instance_id,
                workload_started=self._workload_started,
                background=self._background.hello(),
                background_last_pid=self._background.last_pid,
            )
        )

    async def _session(self, call: SessionCall | None = None) -> bool:
        """One session: `call` (the registration's own stream, its hello sent once the
        activation was taken) or a new ConnectSupervisor stream; True when the sandbox is
        over, False to reconnect."""
        self._session_served = False
        if call is None:
            requests = self._outbox.stream(self._outbox.new_session(), self._hello())
            call = self._link.connect(requests, self._token)
        try:
            return await self._serve_session(call)
        finally:
            # Ends the gateway's handler too, and whatever reads `requests` for it (grpc keeps a
            # task of its own feeding them, which a shared channel would keep alive).
            call.cancel()
            # The gateway failed this session's execs when it ended: nobody can receive their
            # output (or grant it a window) any more, so they stop here too.
            for task in self._execs.values():
                task.cancel()
            self._execs.clear()
            self._background.end_session()  # its commands run on, for the next session to follow
            if self._files is not None:
                self._files.close()

    async def _serve_session(self, call: SessionCall) -> bool:
        async for message in call:
            self._session_served = True
            kind = message.WhichOneof("message")
            if kind == "heartbeat":
                await self._send(spb.SupervisorMessage(heartbeat=spb.Heartbeat(sent_at_ms=int(time.time() * 1000))))
            elif kind == "exec_start":
                await self._start_exec(message.exec_start)
            elif kind == "exec_follow":
                await self._follow(message.exec_follow)
            elif kind in ("exec_input", "exec_resize", "exec_signal"):
                self._exec_control(message)
            elif kind == "file_op":
                if self._files is not None:
                    self._files.handle(message.file_op)
                else:
                    refused = spb.FileResult(op_id=message.file_op.op_id, error="this supervisor does not serve files")
                    await self._send(spb.SupervisorMessage(file_result=refused))
            elif kind == "exec_credit":
                window = self._windows.get(message.exec_credit.exec_id)
                if window is not None:
                    window.grant(message.exec_credit.bytes)
                else:
                    self._background.credit(message.exec_credit.exec_id, message.exec_credit.bytes)
            elif kind == "exec_cancel":
                self._background.cancel(message.exec_cancel.exec_id)
                self._inputs.pop(message.exec_cancel.exec_id, None)
                task = self._execs.pop(message.exec_cancel.exec_id, None)
                if task is not None:
                    task.cancel()
            elif kind == "shutdown":
                if message.shutdown.reconnect:
                    return False
                log.info("gateway ended the sandbox: %s", message.shutdown.reason)
                return True
        return False

    async def _start_exec(self, start: spb.ExecStart) -> None:
        """Start an exec of this session, or a background command kept across sessions."""
        interactive = self._exec_input(start) if start.stream_stdin or start.tty else None
        if start.background:
            await self._background.start(start, interactive)
            return
        if interactive is not None:
            self._inputs[start.exec_id] = interactive
        self._execs[start.exec_id] = asyncio.create_task(self._run_exec(start))

    async def _follow(self, follow: spb.ExecFollow) -> None:
        """The gateway adopted a background command this supervisor listed: send its output."""
        if not self._background.follow(follow.exec_id, follow.offset, follow.output_window_bytes):
            gone = spb.ExecExited(exec_id=follow.exec_id, exit_code=-1, error="no such background command")
            await self._send(spb.SupervisorMessage(exec_exited=gone))

    def _exec_input(self, start: spb.ExecStart) -> ExecInput:
        def credit(size: int) -> None:
            self._outbox.put_control(
                spb.SupervisorMessage(exec_input_credit=spb.ExecInputCredit(exec_id=start.exec_id, bytes=size))
            )

        size = WindowSize(start.rows or DEFAULT_SIZE.rows, start.columns or DEFAULT_SIZE.columns)
        return ExecInput(terminal=size if start.tty else None, credit=credit)

    def _exec_control(self, message: spb.GatewayMessage) -> None:
        """Stdin, a resize or a signal for a running exec (one that ended ignores it)."""
        kind = message.WhichOneof("message") or ""
        exec_id = getattr(message, kind).exec_id
        target = self._inputs.get(exec_id) or self._background.input(exec_id)
        if target is None:
            return
        if kind == "exec_input":
            target.feed(message.exec_input.data)
            if message.exec_input.eof:
                target.end()
        elif kind == "exec_resize":
            target.resize(WindowSize(message.exec_resize.rows, message.exec_resize.columns))
        else:
            target.signal(message.exec_signal.signal)

    def _refresh_delay(self) -> float:
        """Seconds until the token is next refreshed."""
        lifetime = max(0.0, self._token_expires_ms - time.time() * 1000)
        return max(1.0, lifetime * (1 - TOKEN_REFRESH_FRACTION) / 1000)

    async def _refresh_tokens(self) -> None:
        """Started when the first refresh is due: refresh, then wait for the next."""
        while True:
            try:
                response = await self._link.refresh_token(self._token)
            except grpc.aio.AioRpcError as exc:
                log.warning("token refresh failed (%s); will retry", exc.code().name)
                await asyncio.sleep(5)
                continue
            self._token, self._token_expires_ms = response.token, response.expires_at_ms
            await asyncio.sleep(self._refresh_delay())


def main(argv: list[str] | None = None) -> NoReturn:
    """Process entry point: runs the supervisor and ends the process with its exit status (see
    the module doc)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LOG_FORMAT)
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        make_undumpable()
    except OSError as exc:
        log.error("cannot start: %s", exc)
        _exit(2)
    environ = dict(os.environ)
    try:
        settings = SupervisorSettings.from_environment(environ)
    except (SupervisorExit, OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        _exit(2)
    base_env = {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX)}
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        del os.environ[key]
    supervisor = Supervisor(settings, base_env, serve_files=True, process_exit_closes_channel=True)
    loop = asyncio.new_event_loop()
    main_task = loop.create_task(supervisor.run())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main_task.cancel)
    try:
        code = loop.run_until_complete(main_task)
    except asyncio.CancelledError:
        code = 143
    _exit(code)


def _exit(code: int) -> NoReturn:
    """End the process now, its output flushed. `run` has ended the workload, the execs and the
    agent's connection; what is left (the gateway channel, gRPC's core and threads, the event
    loop, the interpreter) the exit releases. Closing them in order first cost a claimed pod's
    supervisor ~2 ms of CPU on kubesim, after its sandbox was over (gRPC's teardown of the
    channel's transport and calls, the loop's last turns), of the ~7-10 its claim costs."""
    with contextlib.suppress(Exception):  # a closed stream: nothing left to flush to
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
