"""The asyncio SDK: `AsyncClient` and `AsyncSandbox`, the same names and arguments as the sync
`Client` and `Sandbox`, awaited (and `run_stream` is `async for`). Requests and the meaning of
each event come from `calls`; this module only moves messages over a grpc.aio channel.

The channel is opened on first use, inside the running event loop (grpc.aio binds a channel to
the loop it was made in); an AsyncClient belongs to that one loop.

Timeouts are arguments, as in the sync client, because they become gRPC deadlines and the
gateway's own command limit, which `asyncio.timeout` around the call could not express.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, Unpack

from grpc import aio

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.sdk import calls, connection, errors, processes, queueing, views
from warmshell.sdk.client import DEFAULT_READY_TIMEOUT_SECONDS
from warmshell.sdk.files import AsyncFiles
from warmshell.sdk.images import AsyncImages
from warmshell.sdk.interactive import AsyncProcess, StdinSource, feed_async, start_request
from warmshell.sdk.transport import CHANNEL_OPTIONS

__all__ = ["AsyncClient", "AsyncSandbox", "Creating"]


class AsyncClient:
    """The async twin of `Client`: one channel to one gateway, found the same way. Close it with
    `await client.close()` or `async with`."""

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
        self._channel: aio.Channel | None = None
        self._slots: queueing.StreamSlots | None = None  # the channel's, for tests and metrics
        self._stub_: sandbox_pb2_grpc.SandboxServiceAsyncStub | None = None

    @property
    def _stub(self) -> sandbox_pb2_grpc.SandboxServiceAsyncStub:
        if self._stub_ is None:
            # A connection of its own (not shared with other clients' channels to the same
            # gateway), so its streams are this client's alone to count against the limit.
            options = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
            self._slots = queueing.StreamSlots()
            self._channel = aio.insecure_channel(self.address, options=options, interceptors=self._slots.interceptors())
            self._stub_ = sandbox_pb2_grpc.SandboxServiceStub(self._channel)
        assert self._stub_ is not None
        return self._stub_

    async def _open_call(self, start: Callable[[], queueing.C]) -> queueing.C:
        """Start a call that writes its requests as it goes, within the client's stream limit."""
        self._stub  # noqa: B018 - opens the channel (and its slots) if it is not yet open
        assert self._slots is not None
        return await self._slots.open(start)

    @property
    def images(self) -> AsyncImages:
        """The gateway's images: import, list, get, remove, prune (`warmshell.sdk.images`)."""
        self._stub  # noqa: B018 - opens the channel
        assert self._channel is not None
        return AsyncImages(self._channel, address=self.address, metadata=self._metadata, timeout=self.timeout)

    async def close(self) -> None:
        """Close the channel (idempotent); calls in flight are cancelled."""
        channel, self._channel, self._stub_ = self._channel, None, None
        if channel is not None:
            await channel.close(grace=None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _translating(self) -> contextlib.AbstractContextManager[None]:
        return errors.translating(self.address)

    def create(
        self,
        *,
        name: str | None = None,
        workspace: str | None = None,
        auto_delete: bool = False,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
        **options: Unpack[calls.CreateOptions],
    ) -> Creating:
        """`Client.create`, awaited: returns once Ready (or already exited); a failed create
        raises (SandboxError, DeadlineExceeded) and leaves nothing behind. Either
        `sb = await client.create(...)`, or `async with client.create(...) as sb:`, which
        deletes the sandbox when the block ends."""
        workspace = self.workspace if workspace is None else workspace
        request = calls.create_request(name=name, workspace=workspace, **options)
        return Creating(self._create(request, auto_delete=auto_delete, ready_timeout=ready_timeout))

    async def _create(
        self, request: pb.CreateSandboxRequest, *, auto_delete: bool, ready_timeout: float | None
    ) -> AsyncSandbox:
        started = time.monotonic()
        deadline = calls.ask_ready(request, ready_timeout=ready_timeout, call_timeout=self.timeout)
        with self._translating():
            created = await self._stub.CreateSandbox(request, metadata=self._metadata, timeout=deadline)
        sandbox = AsyncSandbox(self, views.sandbox_info(created), auto_delete=auto_delete)
        try:
            sandbox.last_info = views.sandbox_info(await self._wait_ready(created, ready_timeout, started))
        except BaseException:
            with contextlib.suppress(errors.Error):
                await sandbox.delete()
            raise
        return sandbox

    async def _wait_ready(self, created: pb.Sandbox, timeout: float | None, started: float) -> pb.Sandbox:  # noqa: ASYNC109
        fold = calls.ReadyFold(created)
        if fold.done():
            return fold.last
        deadline = calls.remaining(timeout, started)
        call = self._stub.WatchSandbox(fold.watch_request(), metadata=self._metadata, timeout=deadline)
        try:
            with self._translating():
                async for event in call:
                    if fold.feed(event):
                        return fold.last
        except errors.DeadlineExceeded:
            raise calls.not_ready_in_time(created.name, timeout) from None
        finally:
            call.cancel()
        raise fold.failure()

    async def get_or_create(
        self,
        name: str,
        *,
        workspace: str | None = None,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
        **options: Unpack[calls.CreateOptions],
    ) -> AsyncSandbox:
        """`Client.get_or_create`, awaited."""
        workspace = self.workspace if workspace is None else workspace
        try:
            return await self.create(name=name, workspace=workspace, ready_timeout=ready_timeout, **options)
        except errors.AlreadyExists:
            with self._translating():
                existing = await self._stub.GetSandbox(
                    pb.SandboxRef(name=name, workspace=workspace), metadata=self._metadata, timeout=self.timeout
                )
        if differences := calls.spec_differences(existing, options):
            raise calls.spec_conflict(existing, differences)
        ready = await self._wait_ready(existing, ready_timeout, time.monotonic())
        return AsyncSandbox(self, views.sandbox_info(ready))

    async def get(self, name: str, *, workspace: str | None = None) -> AsyncSandbox:
        """A handle on an existing sandbox (NotFound if there is none)."""
        return AsyncSandbox(self, await self._get_info(name, self.workspace if workspace is None else workspace))

    async def _get_info(self, name: str, workspace: str) -> views.SandboxInfo:
        with self._translating():
            message = await self._stub.GetSandbox(
                pb.SandboxRef(name=name, workspace=workspace), metadata=self._metadata, timeout=self.timeout
            )
        return views.sandbox_info(message)

    async def list(
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
            response = await self._stub.ListSandboxes(request, metadata=self._metadata, timeout=self.timeout)
        return [views.sandbox_info(s) for s in response.sandboxes]

    async def pools(
        self, *, workspace: str | None = None, all_workspaces: bool = False
    ) -> builtins.list[views.PoolInfo]:
        """Warm pools of the workspace (or every workspace), with their hit counts."""
        request = pb.ListPoolsRequest(
            workspace=self.workspace if workspace is None else workspace, all_workspaces=all_workspaces
        )
        with self._translating():
            response = await self._stub.ListPools(request, metadata=self._metadata, timeout=self.timeout)
        return [views.pool_info(p) for p in response.pools]


class Creating(Awaitable["AsyncSandbox"]):
    """What `AsyncClient.create` returns: await it for the sandbox, or enter it with
    `async with` (no `await`) to have the sandbox deleted when the block ends."""

    def __init__(self, creating: Coroutine[Any, Any, AsyncSandbox]) -> None:
        self._creating = creating
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._creating.__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._creating
        return self._sandbox

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._sandbox is not None
        await self._sandbox.__aexit__(exc_type, exc, tb)


class AsyncSandbox:
    """The async twin of `Sandbox`; `async with` deletes the sandbox on exit."""

    def __init__(self, client: AsyncClient, info: views.SandboxInfo, *, auto_delete: bool = False) -> None:
        self.client = client
        self.name = info.name
        self.workspace = info.workspace
        self.id = info.id
        self.auto_delete = auto_delete
        self.last_info = info
        self._files: AsyncFiles | None = None

    @property
    def files(self) -> AsyncFiles:
        """Read, write, list, stat, remove and mkdir inside the sandbox (`warmshell.sdk.files`)."""
        if self._files is None:
            self.client._stub  # noqa: B018 - opens the client's channel if it is not yet open
            assert self.client._channel is not None
            self._files = AsyncFiles(
                self.client._channel,
                self.name,
                self.workspace,
                metadata=self.client._metadata,
                translate=functools.partial(errors.from_rpc_error, address=self.client.address),
                open_call=self.client._open_call,
                address=self.client.address,
            )
        return self._files

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.workspace}/{self.name}, {self.last_info.phase.value})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.delete()

    async def info(self) -> views.SandboxInfo:
        """The sandbox now: phase, allocation (warm/cold), pool, exit code, conditions, timeline."""
        self.last_info = await self.client._get_info(self.name, self.workspace)
        return self.last_info

    async def _exec_call(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        workdir: str | None,
        timeout: float | None,  # noqa: ASYNC109 - a gRPC deadline
        stdin: bytes | str,
    ) -> AsyncGenerator[pb.ExecEvent, None]:
        """ExecSandbox's events; closing this generator cancels the call (closing grpc.aio's own
        iterator does not), so the gateway kills the command's process group."""
        request = calls.exec_request(
            name=self.name, workspace=self.workspace, argv=argv, env=env, workdir=workdir, timeout=timeout, stdin=stdin
        )
        call = self.client._stub.ExecSandbox(
            request, metadata=self.client._metadata, timeout=calls.exec_deadline(timeout)
        )
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()

    async def start(
        self,
        argv: Sequence[str],
        *,
        tty: bool = False,
        rows: int = 24,
        columns: int = 80,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the same API as the sync client; a gRPC deadline
        background: bool = False,
        open_stdin: bool = False,
    ) -> AsyncProcess:
        """`Sandbox.start`, awaited."""
        request = calls.exec_request(
            name=self.name, workspace=self.workspace, argv=argv, env=env, workdir=workdir, timeout=timeout, stdin=b""
        )
        start = start_request(request, tty=tty, rows=rows, columns=columns)
        if background:
            started = processes.start_process_request(start, open_stdin=open_stdin)
            with self.client._translating():
                info = await self.client._stub.StartProcess(
                    started, metadata=self.client._metadata, timeout=self.client.timeout
                )
            return await self.connect(info.pid, tty=tty)
        stub, deadline = self.client._stub, calls.exec_deadline(timeout)
        call = await self.client._open_call(
            lambda: stub.ExecSandboxStream(None, metadata=self.client._metadata, timeout=deadline)
        )
        return await AsyncProcess.start(call, start, self.client.address)

    async def processes(self) -> builtins.list[processes.ProcessInfo]:
        """`Sandbox.processes`, awaited."""
        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        with self.client._translating():
            message = await self.client._stub.ListProcesses(
                request, metadata=self.client._metadata, timeout=self.client.timeout
            )
        return [processes.process_info(p) for p in message.processes]

    async def connect(self, pid: int, *, tty: bool = False) -> AsyncProcess:
        """`Sandbox.connect`, awaited."""
        stub = self.client._stub
        call = await self.client._open_call(lambda: stub.ConnectProcess(None, metadata=self.client._metadata))
        process = AsyncProcess(call, self.client.address, tty)
        process.pid = pid
        await process._write(processes.attach_request(self.name, self.workspace, pid))
        return process

    async def pty(
        self,
        argv: Sequence[str] = ("sh",),
        *,
        rows: int = 24,
        columns: int = 80,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the same API as the sync client; a gRPC deadline
    ) -> AsyncProcess:
        """`Sandbox.pty`, awaited."""
        environment = {"TERM": "xterm-256color", **(env or {})}
        return await self.start(
            argv, tty=True, rows=rows, columns=columns, env=environment, workdir=workdir, timeout=timeout
        )

    async def _streamed(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        workdir: str | None,
        timeout: float | None,  # noqa: ASYNC109 - a gRPC deadline
        stdin: StdinSource | AsyncIterable[bytes],
    ) -> AsyncGenerator[pb.ExecEvent, None]:
        """ExecSandboxStream with `stdin` fed beside reading the output."""
        process = await self.start(argv, env=env, workdir=workdir, timeout=timeout)
        feeding = asyncio.ensure_future(feed_async(process, stdin))
        try:
            async for event in process._call:
                yield event
            if feeding.done():
                feeding.result()  # raises what failed while feeding
        finally:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError, errors.Error):
                await feeding
            await process.close()

    def _events(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        workdir: str | None,
        timeout: float | None,
        stdin: bytes | str | StdinSource | AsyncIterable[bytes],
    ) -> AsyncGenerator[pb.ExecEvent, None]:
        """The command's events; closing the generator stops the command."""
        if isinstance(stdin, bytes | str):
            return self._exec_call(argv, env, workdir, timeout, stdin)
        return self._streamed(argv, env, workdir, timeout, stdin)

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the same API as the sync client; a gRPC deadline
        stdin: bytes | str | StdinSource | AsyncIterable[bytes] = b"",
        check: bool = False,
    ) -> views.ExecResult:
        """`Sandbox.run`, awaited (`stdin` may also be an async iterable of chunks)."""
        started = time.perf_counter()
        fold = calls.ExecFold()
        async with contextlib.aclosing(self._events(argv, env, workdir, timeout, stdin)) as events:
            with self.client._translating():
                async for event in events:
                    fold.feed(event)
        result = fold.result((time.perf_counter() - started) * 1000)
        return errors.check_result(list(argv), result) if check else result

    async def run_stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the same API as the sync client; a gRPC deadline
        stdin: bytes | str | StdinSource | AsyncIterable[bytes] = b"",
    ) -> AsyncGenerator[views.OutputEvent, None]:
        """`Sandbox.run_stream` as `async for`. Leaving the loop (`break`, an exception in its
        body) or closing the generator (`aclose()`, `contextlib.aclosing`) stops the command: the
        call is cancelled and the gateway kills the command's process group (see `Sandbox.run_stream`
        for the bound). A generator left without `aclose()` is closed when it is garbage-collected
        (at once in CPython, once the loop is left), as asyncio finalizes async generators."""
        async with contextlib.aclosing(self._events(argv, env, workdir, timeout, stdin)) as events:
            with self.client._translating():
                async for event in events:
                    yield calls.output_event(event)

    async def wait_exit(self, timeout: float | None = None) -> views.ExecResult:  # noqa: ASYNC109
        """`Sandbox.wait_exit`, awaited (deletes the sandbox afterwards with `auto_delete`)."""
        fold = calls.ExitFold(self.name)
        request = pb.WatchSandboxRequest(
            name=self.name, workspace=self.workspace, follow_output=True, stop_on_terminal=True
        )
        call = self.client._stub.WatchSandbox(request, metadata=self.client._metadata, timeout=timeout)
        try:
            with self.client._translating():
                async for event in call:
                    fold.feed(event)
        finally:
            call.cancel()
        if fold.last is not None:
            self.last_info = views.sandbox_info(fold.last)
        result = fold.result()
        if self.auto_delete:
            await self.delete()
        return result

    async def egress(self) -> list[views.EgressDecision]:
        """The sandbox's latest egress decisions, oldest first (a bounded log the gateway keeps)."""
        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        with self.client._translating():
            message = await self.client._stub.ListEgress(
                request, metadata=self.client._metadata, timeout=self.client.timeout
            )
        return views.egress_decisions(message)

    async def snapshot(self, image: str, *, force: bool = False) -> views.SnapshotInfo:
        """Capture the sandbox's filesystem as image `image` (NAME:TAG); see `Sandbox.snapshot`
        of the blocking client."""
        request = pb.SnapshotSandboxRequest(name=self.name, workspace=self.workspace, image=image, force=force)
        with self.client._translating():
            message = await self.client._stub.SnapshotSandbox(
                request, metadata=self.client._metadata, timeout=self.client.timeout
            )
        return views.snapshot_info(message)

    async def pause(self, *, pause_ttl_seconds: int = 0) -> views.SandboxInfo:
        """Keep the sandbox's files as an image and stop everything of it; see `Sandbox.pause`
        of the blocking client."""
        request = pb.PauseSandboxRequest(name=self.name, workspace=self.workspace, pause_ttl_seconds=pause_ttl_seconds)
        with self.client._translating():
            message = await self.client._stub.PauseSandbox(
                request, metadata=self.client._metadata, timeout=self.client.timeout
            )
        self.last_info = views.sandbox_info(message)
        return self.last_info

    async def resume(self, *, ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS) -> views.SandboxInfo:
        """Start a Paused sandbox again from its files, once it is Ready; see `Sandbox.resume`."""
        request = calls.resume_request(self.name, self.workspace, ready_timeout=ready_timeout)
        with self.client._translating():
            message = await self.client._stub.ResumeSandbox(
                request,
                metadata=self.client._metadata,
                timeout=calls.fork_call_timeout(ready_timeout, self.client.timeout),
            )
        self.last_info = views.sandbox_info(calls.resumed(message))
        return self.last_info

    async def fork(
        self,
        count: int,
        *,
        prefix: str = "",
        with_secrets: bool = False,
        ready_timeout: float | None = DEFAULT_READY_TIMEOUT_SECONDS,
    ) -> list[AsyncSandbox | errors.ApiError]:
        """`count` new sandboxes from one snapshot of this one's files; see `Sandbox.fork` of
        the blocking client."""
        request = calls.fork_request(
            self.name,
            self.workspace,
            count=count,
            prefix=prefix,
            with_secrets=with_secrets,
            ready_timeout=ready_timeout,
        )
        with self.client._translating():
            response = await self.client._stub.ForkSandbox(
                request,
                metadata=self.client._metadata,
                timeout=calls.fork_call_timeout(ready_timeout, self.client.timeout),
            )
        children: list[AsyncSandbox | errors.ApiError] = []
        for child in response.children:
            outcome = calls.fork_outcome(child)
            if isinstance(outcome, errors.ApiError):
                children.append(outcome)
            else:
                children.append(AsyncSandbox(self.client, views.sandbox_info(outcome)))
        return children

    async def refresh_ttl(self, ttl_seconds: int) -> views.SandboxInfo:
        """Let the sandbox live `ttl_seconds` from now (InvalidArgument beyond the maximum)."""
        request = pb.RefreshTtlRequest(name=self.name, workspace=self.workspace, ttl_seconds=ttl_seconds)
        with self.client._translating():
            message = await self.client._stub.RefreshTtl(
                request, metadata=self.client._metadata, timeout=self.client.timeout
            )
        self.last_info = views.sandbox_info(message)
        return self.last_info

    async def delete(self) -> bool:
        """Delete the sandbox; False when it was already gone (never raises NotFound)."""
        request = pb.SandboxRef(name=self.name, workspace=self.workspace)
        try:
            with self.client._translating():
                await self.client._stub.DeleteSandbox(
                    request, metadata=self.client._metadata, timeout=self.client.timeout
                )
        except errors.NotFound:
            return False
        return True
