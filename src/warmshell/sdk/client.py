"""The synchronous SDK: `Client` (one gRPC channel to one gateway) and `Sandbox` (a handle on one
sandbox). The requests and the meaning of each streamed event come from `calls`, shared with the
async client; this module only moves messages over a blocking channel.

Thread safety: a `Client` may be shared by any number of threads. Its only shared state is the
grpc channel, which is itself thread-safe (calls from several threads are multiplexed on one
HTTP/2 connection), the immutable call metadata, and a lock that makes `close()` idempotent.
Each call builds its own request and reads its own stream, so nothing else needs a lock.
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
from typing import Self

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.sdk import calls, connection, errors, views
from warmshell.sdk.files import Files
from warmshell.sdk.interactive import Process, StdinSource, start_request, stdin_requests

__all__ = ["CHANNEL_OPTIONS", "Client", "Sandbox"]

# The gateway sends up to 16 MiB in one message (a long ListSandboxes); grpc's default is 4 MiB.
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 16 * 1024 * 1024),)
DEFAULT_READY_TIMEOUT_SECONDS = 120.0


def _cancel(call: grpc.CallIterator[pb.SandboxEvent] | grpc.CallIterator[pb.ExecEvent]) -> None:
    """Stop a server stream we no longer read (a no-op once it has ended)."""
    call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave RpcContext.cancel untyped


class Client:
    """A connection to one gateway. Finds it the way the CLI does (`address`, else
    $WARMSHELL_GATEWAY, else the state directory's socket; `token`, else $WARMSHELL_API_TOKEN,
    else `<state dir>/api-token`). Close it (or use `with`) to release the channel."""

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        *,
        state_dir: Path | str | None = None,
        workspace: str | None = None,
        timeout: float = calls.UNARY_TIMEOUT_SECONDS,
    ) -> None:
        target = connection.resolve(address=address, token=token, state_dir=state_dir, workspace=workspace)
        self.address = target.address
        self.workspace = target.workspace
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {target.token}"),) if target.token else ()
        self._channel = grpc.insecure_channel(target.address, options=CHANNEL_OPTIONS)
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(self._channel)
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Close the channel (idempotent); calls in flight are cancelled."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _translating(self) -> contextlib.AbstractContextManager[None]:
        return errors.translating(self.address)

    def create(
        self,
        *,
        name: str | None = None,
        workspace: str | None = None,
        image: str = "",
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        cpu: str = "",
        memory: str = "",
        command: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        idle_timeout_seconds: int | None = None,
        auto_delete: bool = False,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
    ) -> Sandbox:
        """Create a sandbox and return once it is Ready (warm or cold), or once its `command`
        has already exited. A sandbox that fails raises SandboxError with the gateway's reason;
        one not Ready within `ready_timeout` raises DeadlineExceeded. Either way it is deleted:
        a failed create leaves nothing behind. With `auto_delete`, `wait_exit()` deletes it once
        it has returned the workload's output."""
        request = calls.create_request(
            name=name,
            workspace=self.workspace if workspace is None else workspace,
            image=image,
            env=env,
            secrets=secrets,
            cpu=cpu,
            memory=memory,
            command=command,
            labels=labels,
            ttl_seconds=ttl_seconds,
            idle_timeout_seconds=idle_timeout_seconds,
        )
        with self._translating():
            created = self._stub.CreateSandbox(request, metadata=self._metadata, timeout=self.timeout)
        sandbox = Sandbox(self, views.sandbox_info(created), auto_delete=auto_delete)
        try:
            sandbox.last_info = views.sandbox_info(self._wait_ready(created, ready_timeout))
        except BaseException:
            with contextlib.suppress(errors.Error):
                sandbox.delete()
            raise
        return sandbox

    def _wait_ready(self, created: pb.Sandbox, timeout: float | None) -> pb.Sandbox:
        fold = calls.ReadyFold(created)
        if fold.done():
            return fold.last
        request = pb.WatchSandboxRequest(
            name=created.name, workspace=created.workspace, stop_on_terminal=True, stop_on_ready=True
        )
        call = self._stub.WatchSandbox(request, metadata=self._metadata, timeout=timeout)
        try:
            with self._translating():
                for event in call:
                    if fold.feed(event):
                        return fold.last
        except errors.DeadlineExceeded:
            raise errors.DeadlineExceeded(
                f"sandbox {created.name} was not Ready within {timeout:g} s", code="DEADLINE_EXCEEDED"
            ) from None
        finally:
            _cancel(call)
        raise calls.failure(fold.last, name=created.name)

    def get(self, name: str, *, workspace: str | None = None) -> Sandbox:
        """A handle on an existing sandbox (NotFound if there is none)."""
        return Sandbox(self, self._get_info(name, self.workspace if workspace is None else workspace))

    def _get_info(self, name: str, workspace: str) -> views.SandboxInfo:
        with self._translating():
            message = self._stub.GetSandbox(
                pb.SandboxRef(name=name, workspace=workspace), metadata=self._metadata, timeout=self.timeout
            )
        return views.sandbox_info(message)

    def list(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        workspace: str | None = None,
        all_workspaces: bool = False,
    ) -> builtins.list[views.SandboxInfo]:
        """Sandboxes of the workspace (or every workspace) carrying all of `labels`."""
        request = pb.ListSandboxesRequest(
            workspace=self.workspace if workspace is None else workspace,
            all_workspaces=all_workspaces,
            label_selector=calls.label_selector(labels),
        )
        with self._translating():
            response = self._stub.ListSandboxes(request, metadata=self._metadata, timeout=self.timeout)
        return [views.sandbox_info(s) for s in response.sandboxes]

    def pools(self, *, workspace: str | None = None, all_workspaces: bool = False) -> builtins.list[views.PoolInfo]:
        """Warm pools of the workspace (or every workspace), with their hit counts."""
        request = pb.ListPoolsRequest(
            workspace=self.workspace if workspace is None else workspace, all_workspaces=all_workspaces
        )
        with self._translating():
            response = self._stub.ListPools(request, metadata=self._metadata, timeout=self.timeout)
        return [views.pool_info(p) for p in response.pools]


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
        self.files = Files(
            client._channel,
            self.name,
            self.workspace,
            metadata=client._metadata,
            translate=functools.partial(errors.from_rpc_error, address=client.address),
        )
        """Read, write, list, stat, remove and mkdir inside the sandbox (`warmshell.sdk.files`)."""

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
    ) -> grpc.CallIterator[pb.ExecEvent]:
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
        if streamed:  # read lazily, as fast as the command takes it
            requests = stdin_requests(start_request(request, tty=False), stdin)  # type: ignore[arg-type]
            return self.client._stub.ExecSandboxStream(requests, metadata=self.client._metadata, timeout=deadline)
        return self.client._stub.ExecSandbox(request, metadata=self.client._metadata, timeout=deadline)

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
    ) -> Process:
        """Start a command whose stdin you stream (`send`, `close_stdin`), that you can `signal`,
        and read its output as it comes (`recv`, iteration, `wait`). With `tty`, it runs on a
        pseudo-terminal in the sandbox of `rows` x `columns` (see `pty`)."""
        request = calls.exec_request(
            name=self.name, workspace=self.workspace, argv=argv, env=env, workdir=workdir, timeout=timeout, stdin=b""
        )
        start = start_request(request, tty=tty, rows=rows, columns=columns)
        with self.client._translating():
            return Process(
                lambda requests: self.client._stub.ExecSandboxStream(
                    requests, metadata=self.client._metadata, timeout=calls.exec_deadline(timeout)
                ),
                start,
                self.client.address,
            )

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
    ) -> views.ExecResult:
        """Run a command (an argv list, no shell) and return its exit code and output. A command
        still running after `timeout` seconds is killed and exits 124. `stdin` is bytes, or an
        iterable of byte chunks or a binary file, streamed as the command reads it."""
        started = time.perf_counter()
        fold = calls.ExecFold()
        with self.client._translating():
            for event in self._exec_call(argv, env, workdir, timeout, stdin):
                fold.feed(event)
        return fold.result((time.perf_counter() - started) * 1000)

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
        Leaving the loop early (or closing the iterator) stops the command."""
        call = self._exec_call(argv, env, workdir, timeout, stdin)
        try:
            with self.client._translating():
                for event in call:
                    yield calls.output_event(event)
        finally:
            _cancel(call)

    def wait_exit(self, timeout: float | None = None) -> views.ExecResult:
        """Wait for the workload (`create(command=...)`) to exit and return its exit code and
        all its output (`duration_ms`: how long it ran). Deletes the sandbox afterwards when it
        was created with `auto_delete`."""
        fold = calls.ExitFold(self.name)
        request = pb.WatchSandboxRequest(
            name=self.name, workspace=self.workspace, follow_output=True, stop_on_terminal=True
        )
        call = self.client._stub.WatchSandbox(request, metadata=self.client._metadata, timeout=timeout)
        try:
            with self.client._translating():
                for event in call:
                    fold.feed(event)
        finally:
            _cancel(call)
        if fold.last is not None:
            self.last_info = views.sandbox_info(fold.last)
        result = fold.result()
        if self.auto_delete:
            self.delete()
        return result

    def refresh_ttl(self, ttl_seconds: int) -> views.SandboxInfo:
        """Let the sandbox live `ttl_seconds` from now (InvalidArgument beyond the maximum)."""
        request = pb.RefreshTtlRequest(name=self.name, workspace=self.workspace, ttl_seconds=ttl_seconds)
        with self.client._translating():
            message = self.client._stub.RefreshTtl(request, metadata=self.client._metadata, timeout=self.client.timeout)
        self.last_info = views.sandbox_info(message)
        return self.last_info

    def delete(self) -> bool:
        """Delete the sandbox; False when it was already gone (never raises NotFound)."""
        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        try:
            with self.client._translating():
                self.client._stub.DeleteSandbox(request, metadata=self.client._metadata, timeout=self.client.timeout)
        except errors.NotFound:
            return False
        return True
