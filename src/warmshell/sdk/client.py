"""The synchronous SDK: `Client` (one transport to one gateway) and `Sandbox` (a handle on one
sandbox). The requests and the meaning of each streamed event come from `calls`, shared with the
async client; the messages move through `service.SandboxService` over a `transport` (grpcio by
default; `transport="http2"` for the light client the CLI uses on a Unix socket).

Thread safety: a `Client` may be shared by any number of threads. Its only shared state is the
transport, which is itself thread-safe (grpcio multiplexes calls on one HTTP/2 connection; the
HTTP/2 transport gives each call a connection of its own), the immutable call metadata, and a
lock that makes `close()` idempotent. Each call builds its own request and reads its own
stream, so nothing else needs a lock.

The views are imported by the calls that return one (see `calls`): constructing a Client and
using `client.service`, as the CLI does, never loads them.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self, Unpack

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import calls, connection, errors, following
from warmshell.sdk import transport as transport_module
from warmshell.sdk.service import SandboxService

if TYPE_CHECKING:
    import grpc

    from warmshell.api.v1 import sandbox_pb2_grpc
    from warmshell.sdk import building, views
    from warmshell.sdk.files import Files
    from warmshell.sdk.images import Images
    from warmshell.sdk.interactive import Process, StdinSource
    from warmshell.sdk.processes import ProcessInfo

__all__ = ["DEFAULT_READY_TIMEOUT_SECONDS", "STREAM_STOP_BOUND_SECONDS", "Client", "Sandbox"]

DEFAULT_READY_TIMEOUT_SECONDS = 120.0
# How soon a command whose stream was left (or closed) has stopped, process group and all: the
# cancel reaches the gateway in one write and the sandbox's supervisor kills the group at once;
# a few milliseconds on a quiet local gateway, the rest is margin for a loaded host.
STREAM_STOP_BOUND_SECONDS = 2.0


class Client:
    """A connection to one gateway. Finds it the way the CLI does (`address`, else
    $WARMSHELL_GATEWAY, else the state directory's socket; `token`, else $WARMSHELL_API_TOKEN,
    else `<state dir>/api-token`). Close it (or use `with`) to release the channel.

    `transport`: "grpcio" (the default) or "http2", the light client for a Unix socket (see
    `warmshell.sdk.transport`; $WARMSHELL_TRANSPORT overrides it). `service` is the wire layer
    underneath (protobuf messages in and out), for tools that render the messages themselves."""

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        *,
        state_dir: Path | str | None = None,
        workspace: str | None = None,
        timeout: float = calls.UNARY_TIMEOUT_SECONDS,
        transport: str = "grpcio",
    ) -> None:
        target = connection.resolve(address=address, token=token, state_dir=state_dir, workspace=workspace)
        self.address = target.address
        self.workspace = target.workspace
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {target.token}"),) if target.token else ()
        self._transport = transport_module.open_transport(target.address, transport)
        self.service = SandboxService(self._transport, self._metadata, timeout=timeout)
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Close the channel (idempotent); calls in flight are cancelled."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(
        self,
        *,
        name: str | None = None,
        workspace: str | None = None,
        auto_delete: bool = False,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
        **options: Unpack[calls.CreateOptions],
    ) -> Sandbox:
        """Create a sandbox and return once it is Ready (warm or cold), or once its `command`
        has already exited; `options` are `calls.CreateOptions` (image, env, secrets, cpu,
        memory, pids, command, no_command, labels, ttl_seconds, idle_timeout_seconds). A sandbox that fails
        raises SandboxError with the gateway's reason; one not Ready within `ready_timeout`
        raises DeadlineExceeded. Either way it is deleted: a failed create leaves nothing
        behind. With `auto_delete`, `wait_exit()` deletes it once it has returned the
        workload's output."""
        from warmshell.sdk import views

        workspace = self.workspace if workspace is None else workspace
        request = calls.create_request(name=name, workspace=workspace, **options)
        started = time.monotonic()
        deadline = calls.ask_ready(request, ready_timeout=ready_timeout, call_timeout=self.timeout)
        created = self.service.create_sandbox(request, timeout=deadline)
        sandbox = Sandbox(self, views.sandbox_info(created), auto_delete=auto_delete)
        try:
            sandbox.last_info = views.sandbox_info(self._wait_ready(created, ready_timeout, started))
        except BaseException:
            with contextlib.suppress(errors.Error):
                sandbox.delete()
            raise
        return sandbox

    def _wait_ready(self, created: pb.Sandbox, timeout: float | None, started: float) -> pb.Sandbox:
        fold = calls.ReadyFold(created)
        try:
            following.follow(self.service, fold, timeout=calls.remaining(timeout, started))
        except errors.DeadlineExceeded:
            raise calls.not_ready_in_time(created.name, timeout) from None
        if not fold.done():  # the gateway ended the stream first
            raise fold.failure()
        return fold.last

    def get_or_create(
        self,
        name: str,
        *,
        workspace: str | None = None,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
        **options: Unpack[calls.CreateOptions],
    ) -> Sandbox:
        """The sandbox `name`: created as `create` would when there is none; when there is one
        whose spec has every option given here (quantities compared by amount, secrets by name),
        that one, once Ready. One with another spec raises Conflict naming the options that
        differ; it is left as it is."""
        from warmshell.sdk import views

        workspace = self.workspace if workspace is None else workspace
        try:
            return self.create(name=name, workspace=workspace, ready_timeout=ready_timeout, **options)
        except errors.AlreadyExists:
            existing = self.service.get_sandbox(pb.SandboxRef(name=name, workspace=workspace))
        if differences := calls.spec_differences(existing, options):
            raise calls.spec_conflict(existing, differences)
        return Sandbox(self, views.sandbox_info(self._wait_ready(existing, ready_timeout, time.monotonic())))

    def get(self, name: str, *, workspace: str | None = None) -> Sandbox:
        """A handle on an existing sandbox (NotFound if there is none)."""
        return Sandbox(self, self._get_info(name, self.workspace if workspace is None else workspace))

    def _get_info(self, name: str, workspace: str) -> views.SandboxInfo:
        from warmshell.sdk import views

        return views.sandbox_info(self.service.get_sandbox(pb.SandboxRef(name=name, workspace=workspace)))

    @property
    def _channel(self) -> grpc.Channel:
        """A grpcio channel to the gateway for the calls the transport does not carry (client
        and bidirectional streaming: file writes, interactive sessions); opened on first use."""
        return self._transport.grpc_channel()

    @functools.cached_property
    def _stub(self) -> sandbox_pb2_grpc.SandboxServiceStub:
        """The SandboxService stub on `_channel`, for the same calls (made once: a stub builds a
        multicallable per method)."""
        from warmshell.api.v1 import sandbox_pb2_grpc

        return sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    def files(self, name: str, *, workspace: str | None = None) -> Files:
        """The files of sandbox `name` (what `get(name).files` is, without fetching it first)."""
        from warmshell.sdk.files import Files

        return Files(
            self._channel,
            name,
            self.workspace if workspace is None else workspace,
            metadata=self._metadata,
            translate=functools.partial(errors.from_rpc_error, address=self.address),
            address=self.address,
        )

    @functools.cached_property
    def images(self) -> Images:
        """The gateway's images: import, list, get, remove, prune (`warmshell.sdk.images`)."""
        from warmshell.sdk.images import Images

        return Images(self._transport, metadata=self._metadata, timeout=self.timeout)

    def list(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        workspace: str | None = None,
        all_workspaces: bool = False,
    ) -> builtins.list[views.SandboxInfo]:
        """Sandboxes of the workspace (or every workspace) carrying all of `labels`."""
        from warmshell.sdk import views

        request = pb.ListSandboxesRequest(
            workspace=self.workspace if workspace is None else workspace,
            all_workspaces=all_workspaces,
            label_selector=calls.label_selector(labels),
        )
        return [views.sandbox_info(s) for s in self.service.list_sandboxes(request).sandboxes]

    def resume(
        self, name: str, *, workspace: str | None = None, ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS
    ) -> Sandbox:
        """Start the Paused sandbox `name` again from its files (see `Sandbox.pause`); its handle
        once it is Ready."""
        from warmshell.sdk import views

        workspace = self.workspace if workspace is None else workspace
        request = calls.resume_request(name, workspace, ready_timeout=ready_timeout)
        message = self.service.resume_sandbox(request, timeout=calls.fork_call_timeout(ready_timeout, self.timeout))
        return Sandbox(self, views.sandbox_info(calls.resumed(message)))

    def build_image(
        self,
        tag: str,
        *,
        base: str,
        steps: Sequence[building.Step],
        allow_net: Sequence[str] = (),
        force: bool = False,
        output: building.Output | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> views.SnapshotInfo:
        """Build image `tag` (NAME:TAG) from image `base` by `steps` (`building.Run("make")`,
        `building.Copy(Path("src"), "/workspace/src")`) in a fresh sandbox whose egress is
        `allow_net`; `output(stream, chunk)` hears each step's output; `labels` go on the sandbox.
        BuildFailed names the first step that failed; the sandbox is deleted either way (see
        `warmshell.sdk.building`)."""
        from warmshell.sdk import building

        return building.build(
            self, base=base, steps=steps, tag=tag, allow_net=allow_net, force=force, output=output, labels=labels
        )

    def pools(self, *, workspace: str | None = None, all_workspaces: bool = False) -> builtins.list[views.PoolInfo]:
        """Warm pools of the workspace (or every workspace), with their hit counts."""
        from warmshell.sdk import views

        request = pb.ListPoolsRequest(
            workspace=self.workspace if workspace is None else workspace, all_workspaces=all_workspaces
        )
        return [views.pool_info(p) for p in self.service.list_pools(request).pools]


class Sandbox:
    """A handle on one sandbox; `last_info` is the latest snapshot any call returned. As a
    context manager it deletes the sandbox on exit."""

    def __init__(self, client: Client, info: views.SandboxInfo, *, auto_delete: bool = False) -> None:
        self.client = client
        self.name = info.name
        self.workspace = info.workspace
        self.id = info.id
        self.auto_delete = auto_delete
        self.last_info = info
        self._files: Files | None = None

    @property
    def files(self) -> Files:
        """Read, write, list, stat, remove and mkdir inside the sandbox (`warmshell.sdk.files`)."""
        if self._files is None:
            self._files = self.client.files(self.name, workspace=self.workspace)
        return self._files

    def __repr__(self) -> str:
        return f"Sandbox({self.workspace}/{self.name}, {self.last_info.phase.value})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()

    def info(self) -> views.SandboxInfo:
        """The sandbox now: phase, allocation (warm/cold), pool, exit code, conditions, timeline."""
        self.last_info = self.client._get_info(self.name, self.workspace)
        return self.last_info

    def _exec_call(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        workdir: str | None,
        timeout: float | None,
        stdin: bytes | str | StdinSource,
    ) -> transport_module.ServerStream[pb.ExecEvent]:
        streamed = not isinstance(stdin, bytes | str)
        request = calls.exec_request(
            name=self.name,
            workspace=self.workspace,
            argv=argv,
            env=env,
            workdir=workdir,
            timeout=timeout,
            stdin=b"" if streamed else stdin,  # type: ignore[arg-type]
        )
        deadline = calls.exec_deadline(timeout)
        if not streamed:
            return self.client.service.exec_sandbox(request, timeout=deadline)
        # Client streaming is grpcio's (the light transport carries no request streams); stdin
        # is read lazily, as fast as the command takes it.
        from warmshell.sdk.interactive import start_request, stdin_requests

        requests = stdin_requests(start_request(request, tty=False), stdin)  # type: ignore[arg-type]
        with errors.translating(self.client.address):
            call = self.client._stub.ExecSandboxStream(requests, metadata=self.client._metadata, timeout=deadline)
        return transport_module.GrpcStream(call, self.client.address)

    def start(
        self,
        argv: Sequence[str],
        *,
        tty: bool = False,
        rows: int = 24,
        columns: int = 80,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        background: bool = False,
        open_stdin: bool = False,
    ) -> Process:
        """Start a command whose stdin you stream (`send`, `close_stdin`), that you can `signal`,
        and read its output as it comes (`recv`, iteration, `wait`). With `tty`, it runs on a
        pseudo-terminal in the sandbox of `rows` x `columns` (see `pty`).

        With `background`, it runs until it exits whoever is connected: the handle has a `pid`,
        closing it only detaches, and any client can list it (`processes`) and reattach
        (`connect(pid)`) to read its kept output, then live output and its exit; its stdin is
        closed at once unless `open_stdin` (`warmshell.sdk.processes`)."""
        from warmshell.sdk.interactive import Process, start_request
        from warmshell.sdk.processes import start_process_request

        request = calls.exec_request(
            name=self.name, workspace=self.workspace, argv=argv, env=env, workdir=workdir, timeout=timeout, stdin=b""
        )
        start = start_request(request, tty=tty, rows=rows, columns=columns)
        if background:
            info = self.client.service.start_process(start_process_request(start, open_stdin=open_stdin))
            return self.connect(info.pid, tty=tty)
        with errors.translating(self.client.address):
            return Process(
                lambda requests: self.client._stub.ExecSandboxStream(
                    requests, metadata=self.client._metadata, timeout=calls.exec_deadline(timeout)
                ),
                start,
                self.client.address,
            )

    def processes(self) -> builtins.list[ProcessInfo]:
        """The sandbox's background commands, running and recently exited, oldest first."""
        from warmshell.sdk.processes import process_info

        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        return [process_info(p) for p in self.client.service.list_processes(request).processes]

    def connect(self, pid: int, *, tty: bool = False) -> Process:
        """Reattach to background command `pid` (of this client or any other): its output the
        gateway kept, then live output and its exit; `send`, `signal`, `kill`, `wait` as on any
        Process; `close` detaches (NotFound for no such pid, on the first read). The command
        never waits for a reader: one more than the gateway's `exec_history_bytes` behind it
        loses the oldest bytes, and the next event's `dropped_bytes` says how many."""
        from warmshell.sdk.interactive import Process
        from warmshell.sdk.processes import attach_request

        with errors.translating(self.client.address):
            process = Process(
                lambda requests: self.client._stub.ConnectProcess(requests, metadata=self.client._metadata),
                attach_request(self.name, self.workspace, pid),
                self.client.address,
            )
        process.tty, process.pid = tty, pid
        return process

    def pty(
        self,
        argv: Sequence[str] = ("sh",),
        *,
        rows: int = 24,
        columns: int = 80,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
    ) -> Process:
        """An interactive shell (or `argv`) on a pseudo-terminal in the sandbox: `send` what is
        typed (b"\x03" interrupts), `resize`, `recv` what the terminal shows, `close`."""
        environment = {"TERM": "xterm-256color", **(env or {})}
        return self.start(argv, tty=True, rows=rows, columns=columns, env=environment, workdir=workdir, timeout=timeout)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: bytes | str | StdinSource = b"",
        check: bool = False,
    ) -> views.ExecResult:
        """Run a command (an argv list, no shell) and return its exit code, output and how it
        ended. A command still running after `timeout` seconds is killed (`timed_out`, exit code
        124); one that cannot start has `error` set (its stderr stays empty). `stdin` is bytes,
        or an iterable of byte chunks or a binary file, streamed as the command reads it. With
        `check`, CommandTimeout or CommandFailed unless it exited 0."""
        started = time.perf_counter()
        fold = calls.ExecFold()
        stream = self._exec_call(argv, env, workdir, timeout, stdin)
        try:
            for event in stream:
                fold.feed(event)
        finally:
            stream.cancel()  # a no-op once ended; after Ctrl-C it stops the command
        result = fold.result((time.perf_counter() - started) * 1000)
        return errors.check_result(list(argv), result) if check else result

    def run_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,
        stdin: bytes | str | StdinSource = b"",
    ) -> Generator[views.OutputEvent, None, None]:
        """Run a command and yield its output as it comes, then one event with the exit code.

        Leaving the loop early (`break`, an exception in its body) or closing the generator
        (`close()`, `contextlib.closing`) stops the command: the call is cancelled, and the
        gateway kills the command's process group (SIGKILL) as soon as it sees the cancel, on
        either transport — within `STREAM_STOP_BOUND_SECONDS` (tests hold both clients to it).
        A generator kept in a variable after the loop is stopped only when closed or collected."""
        stream = self._exec_call(argv, env, workdir, timeout, stdin)
        try:
            for event in stream:
                yield calls.output_event(event)
        finally:
            stream.cancel()

    def wait_exit(self, timeout: float | None = None) -> views.ExecResult:
        """Wait for the workload (`create(command=...)`) to exit and return its exit code and
        all its output (`duration_ms`: how long it ran). Deletes the sandbox afterwards when it
        was created with `auto_delete`."""
        from warmshell.sdk import views

        fold = calls.ExitFold(self.name)
        request = pb.WatchSandboxRequest(
            name=self.name, workspace=self.workspace, follow_output=True, stop_on_terminal=True
        )
        stream = self.client.service.watch_sandbox(request, timeout=timeout)
        try:
            for event in stream:
                fold.feed(event)
        finally:
            stream.cancel()
        if fold.last is not None:
            self.last_info = views.sandbox_info(fold.last)
        result = fold.result()
        if self.auto_delete:
            self.delete()
        return result

    def refresh_ttl(self, ttl_seconds: int) -> views.SandboxInfo:
        """Let the sandbox live `ttl_seconds` from now (InvalidArgument beyond the maximum)."""
        from warmshell.sdk import views

        request = pb.RefreshTtlRequest(name=self.name, workspace=self.workspace, ttl_seconds=ttl_seconds)
        self.last_info = views.sandbox_info(self.client.service.refresh_ttl(request))
        return self.last_info

    def egress(self) -> builtins.list[views.EgressDecision]:
        """The sandbox's latest egress decisions, oldest first (a bounded log the gateway keeps)."""
        from warmshell.sdk import views

        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        return views.egress_decisions(self.client.service.list_egress(request))

    def snapshot(self, image: str, *, force: bool = False) -> views.SnapshotInfo:
        """Capture the sandbox's filesystem (what it wrote over its image, and /workspace) as image
        `image` (NAME:TAG); it is frozen meanwhile and keeps running. AlreadyExists when the tag
        names an image (unless `force`); FailedPrecondition when it is not Ready or has no image."""
        from warmshell.sdk import views

        request = pb.SnapshotSandboxRequest(name=self.name, workspace=self.workspace, image=image, force=force)
        return views.snapshot_info(self.client.service.snapshot_sandbox(request))

    def pause(self, *, pause_ttl_seconds: int = 0) -> views.SandboxInfo:
        """Keep the sandbox's files (what it wrote over its image, and /workspace) as an image and
        stop everything of it: no process, no memory, no runtime; it stays, Paused, until
        `resume()` or its pause TTL (`pause_ttl_seconds`, else the gateway's) deletes it.
        Processes and memory are not kept: a resume runs the command afresh. On Kubernetes the
        pod is deleted and its Sandbox suspended instead: `/workspace` survives when the gateway
        puts it on a volume claim (`kubernetes.workspace_claim_size`), not as an emptyDir."""
        from warmshell.sdk import views

        request = pb.PauseSandboxRequest(name=self.name, workspace=self.workspace, pause_ttl_seconds=pause_ttl_seconds)
        self.last_info = views.sandbox_info(self.client.service.pause_sandbox(request))
        return self.last_info

    def resume(self, *, ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS) -> views.SandboxInfo:
        """Start a Paused sandbox again from its files; returns once it is Ready (SandboxError
        if it is not within `ready_timeout`)."""
        from warmshell.sdk import views

        request = calls.resume_request(self.name, self.workspace, ready_timeout=ready_timeout)
        message = self.client.service.resume_sandbox(
            request, timeout=calls.fork_call_timeout(ready_timeout, self.client.timeout)
        )
        self.last_info = views.sandbox_info(calls.resumed(message))
        return self.last_info

    def fork(
        self,
        count: int,
        *,
        prefix: str = "",
        with_secrets: bool = False,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
    ) -> builtins.list[Sandbox | errors.ApiError]:
        """`count` new sandboxes from one snapshot of this one's files (not its processes'
        memory: each child runs its command afresh), named PREFIX-1.. (default NAME-fork-1..),
        with its spec and its secrets only when `with_secrets`; one entry per child, in order:
        the Ready child, or the error it ended with."""
        from warmshell.sdk import views

        request = calls.fork_request(
            self.name,
            self.workspace,
            count=count,
            prefix=prefix,
            with_secrets=with_secrets,
            ready_timeout=ready_timeout,
        )
        response = self.client.service.fork_sandbox(
            request, timeout=calls.fork_call_timeout(ready_timeout, self.client.timeout)
        )
        children: builtins.list[Sandbox | errors.ApiError] = []
        for child in response.children:
            outcome = calls.fork_outcome(child)
            children.append(
                outcome if isinstance(outcome, errors.ApiError) else Sandbox(self.client, views.sandbox_info(outcome))
            )
        return children

    def delete(self) -> bool:
        """Delete the sandbox; False when it was already gone (never raises NotFound)."""
        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        try:
            self.client.service.delete_sandbox(request)
        except errors.NotFound:
            return False
        return True
