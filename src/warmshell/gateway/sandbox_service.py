"""The public SandboxService: create, get, list, delete, watch, exec (in the foreground, or in
the background: start, list, reattach) and refresh a TTL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import grpc

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.core import phases
from warmshell.core.config import DEFAULT_EXEC_HISTORY_BYTES, DEFAULT_EXEC_WINDOW_BYTES
from warmshell.core.errors import InvalidArgumentError, NotFoundError, UnavailableError
from warmshell.core.models import DEFAULT_WORKSPACE, Phase, SandboxRecord
from warmshell.core.validation import validate_command, validate_environment, validate_workspace
from warmshell.gateway import metrics, usage
from warmshell.gateway.auth import Authenticator
from warmshell.gateway.background import BackgroundProcesses
from warmshell.gateway.calls import streaming, unary
from warmshell.gateway.convert import new_sandbox, pool_to_proto, sandbox_to_proto, usage_to_proto
from warmshell.gateway.egress.gate import NETWORK_CONDITION, EgressGate
from warmshell.gateway.events import Changed, Closing, Deleted, Output, Progress
from warmshell.gateway.execs import ExecRelay, check_terminal_size
from warmshell.gateway.forwarding import Forwarder, Target
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.sessions import SupervisorSession
from warmshell.gateway.snapshot_calls import SnapshotCalls

__all__ = ["SandboxService", "parse_label_selector"]

Ctx = grpc.aio.ServicerContext[Any, Any]
MAX_EXEC_TIMEOUT_SECONDS = 24 * 3600
_SERVICE = "/warmshell.v1.SandboxService/"


def parse_label_selector(selector: str) -> dict[str, str]:
    """ "k1=v1,k2=v2" -> {"k1": "v1", "k2": "v2"} (equality only)."""
    result: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError("label_selector", f"{part!r} must look like key=value")
        result[key.strip()] = value.strip().removeprefix("=")
    return result


def _terminal(record: SandboxRecord) -> bool:
    return record.status.phase in phases.TERMINAL


def _settled(record: SandboxRecord) -> bool:
    return phases.settled(record.status)


class SandboxService(SnapshotCalls, sandbox_pb2_grpc.SandboxServiceServicer):
    """gRPC handlers; the logic lives in SandboxManager."""

    def __init__(
        self,
        manager: SandboxManager,
        auth: Authenticator,
        execs: ExecRelay | None = None,
        forwarder: Forwarder | None = None,
        *,
        egress: EgressGate | None = None,
        background: BackgroundProcesses | None = None,
    ) -> None:
        """`forwarder`: with several replicas, how calls needing another replica's session reach
        it; `egress`: the proxy whose decisions ListEgress shows; `background`: the background
        commands of the sandboxes whose sessions this gateway holds."""
        self._manager = manager
        self._egress = egress
        self._forwarder = forwarder
        self._execs = execs or ExecRelay(window_bytes=DEFAULT_EXEC_WINDOW_BYTES, stall_seconds=60.0)
        self._background = background or BackgroundProcesses(self._execs, history_bytes=DEFAULT_EXEC_HISTORY_BYTES)
        self._records = manager.records
        self._auth = auth

    @unary
    async def CreateSandbox(self, request: pb.CreateSandboxRequest, context: Ctx) -> pb.Sandbox:
        await self._auth.require_client(context)
        timeout = request.ready_timeout_ms / 1000 or None
        record = await self._manager.create(new_sandbox(request), wait_ready=request.wait_ready, ready_timeout=timeout)
        if request.wait_ready:
            record = await self._settled(record, timeout)
        return sandbox_to_proto(record)

    async def _settled(self, record: SandboxRecord, timeout: float | None) -> SandboxRecord:  # noqa: ASYNC109
        """The record once it is Ready or terminal, else as it is when `timeout` seconds have
        passed (the caller watches on). A record removed meanwhile is NOT_FOUND, as a watch of it
        would be."""
        if _settled(record):
            return record  # (a warm create's session is often folded into the create's own write)
        async with self._manager.bus.subscribe(record.id, replay_output=False) as queue:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while True:
                        # Read after subscribing (and after each wake-up): no change falls in between.
                        current = await self._records.get(record.id, may_lag=True)
                        if current is None:
                            break
                        record = current
                        if _settled(record):
                            return record
                        item = await queue.get()
                        while not queue.empty() and not isinstance(item, Deleted | Closing):
                            item = queue.get_nowait()  # one re-read for everything queued
                        if isinstance(item, Closing):
                            return record  # the gateway is stopping: the caller watches again elsewhere
                        if isinstance(item, Deleted):
                            break
                    raise NotFoundError(f"sandbox {record.workspace}/{record.name} was deleted before it was Ready")
        return record

    @unary
    async def RefreshTtl(self, request: pb.RefreshTtlRequest, context: Ctx) -> pb.Sandbox:
        await self._auth.require_client(context)
        self._check_ref(request.workspace, request.name)
        return sandbox_to_proto(await self._manager.refresh_ttl(request.workspace, request.name, request.ttl_seconds))

    @unary
    async def ListEgress(self, request: pb.SandboxRef, context: Ctx) -> pb.ListEgressResponse:
        await self._auth.require_client(context)
        record = await self._lookup(request.workspace, request.name)
        if self._egress is None:
            return pb.ListEgressResponse()
        decisions = [
            pb.EgressDecision(**dataclasses.asdict(entry)) for entry in self._egress.proxy.decisions(record.id)
        ]
        if self._forwarder is not None:
            # Each replica keeps the decisions of the connections it served (a local sandbox's all
            # on the replica that activated it; a pod's on whichever its proxy connections reached).
            others = await self._forwarder.others(context)
            answers = await self._forwarder.gather_unary(
                others, _SERVICE + "ListEgress", request, pb.ListEgressResponse.FromString, context
            )
            decisions = sorted([*decisions, *(d for a in answers for d in a.decisions)], key=lambda d: d.time_ms)
        condition = record.status.condition(NETWORK_CONDITION)
        return pb.ListEgressResponse(decisions=decisions, policy=condition.message if condition is not None else "")

    @unary
    async def GetSandbox(self, request: pb.SandboxRef, context: Ctx) -> pb.Sandbox:
        await self._auth.require_client(context)
        record = await self._lookup(request.workspace, request.name)
        message = sandbox_to_proto(record)
        message.status.usage.CopyFrom(usage_to_proto(await usage.read(self._manager.driver, record)))
        if self._egress is not None and (traffic := self._egress.proxy.traffic(record.id)) is not None:
            message.status.usage.egress_bytes_out, message.status.usage.egress_bytes_in = traffic
        return message

    @unary
    async def ListSandboxes(self, request: pb.ListSandboxesRequest, context: Ctx) -> pb.ListSandboxesResponse:
        await self._auth.require_client(context)
        selector = parse_label_selector(request.label_selector)
        workspace = None if request.all_workspaces else (request.workspace or DEFAULT_WORKSPACE)
        records = await self._records.list(workspace)
        return pb.ListSandboxesResponse(
            sandboxes=[sandbox_to_proto(r) for r in records if all(r.labels.get(k) == v for k, v in selector.items())]
        )

    @unary
    async def DeleteSandbox(self, request: pb.SandboxRef, context: Ctx) -> pb.DeleteSandboxResponse:
        await self._auth.require_client(context)
        self._check_ref(request.workspace, request.name)
        return pb.DeleteSandboxResponse(deleted=await self._manager.delete(request.workspace, request.name))

    @streaming
    async def WatchSandbox(self, request: pb.WatchSandboxRequest, context: Ctx) -> AsyncIterator[pb.SandboxEvent]:
        await self._auth.require_client(context)
        record = await self._lookup(request.workspace, request.name)
        if request.follow_output and (forwarded := await self._forwarded_watch(record, request, context)):
            async for event in forwarded:
                yield event
            return
        async with self._manager.bus.subscribe(record.id, replay_output=request.follow_output) as queue:
            # Re-read after subscribing so no change can fall between the read and the subscription.
            current = await self._records.get(record.id, may_lag=True)
            if current is None:
                yield pb.SandboxEvent(deleted=record.id)
                return
            yield pb.SandboxEvent(sandbox=sandbox_to_proto(current))
            if self._done(request, current) and queue.empty():
                return
            while True:
                item = await queue.get()
                if isinstance(item, Progress):
                    yield pb.SandboxEvent(
                        progress=pb.ProgressEvent(
                            timestamp_ms=item.timestamp_ms,
                            type="Warning" if item.warning else "Normal",
                            reason=item.reason,
                            message=item.message,
                        )
                    )
                elif isinstance(item, Output):
                    if request.follow_output:
                        stream = pb.OutputChunk.STREAM_STDERR if item.stderr else pb.OutputChunk.STREAM_STDOUT
                        yield pb.SandboxEvent(output=pb.OutputChunk(stream=stream, data=item.data))
                elif isinstance(item, Deleted):
                    yield pb.SandboxEvent(deleted=record.id)
                    return
                elif isinstance(item, Closing):
                    raise UnavailableError("the gateway is shutting down: watch again")
                elif isinstance(item, Changed):
                    latest = await self._records.get(record.id, may_lag=True)
                    if latest is None:
                        yield pb.SandboxEvent(deleted=record.id)
                        return
                    if latest.resource_version != current.resource_version:
                        current = latest
                        yield pb.SandboxEvent(sandbox=sandbox_to_proto(current))
                    if request.follow_output and (forwarded := await self._forwarded_watch(latest, request, context)):
                        # The session opened on another replica: its output is there (buffered
                        # from the start), so the rest of this watch is that replica's.
                        async for event in forwarded:
                            yield event
                        return
                if self._done(request, current) and queue.empty():
                    return

    async def _forwarded_watch(
        self, record: SandboxRecord, request: pb.WatchSandboxRequest, context: Ctx
    ) -> AsyncIterator[pb.SandboxEvent] | None:
        """The owner's watch when another replica holds the session (workload output lives
        there); None to watch here."""
        if self._forwarder is None or self._manager.sessions.get(record.id) is not None:
            return None
        target = await self._forwarder.target(record, context)
        if target is None:
            return None
        return self._forwarder.unary_stream(
            target, _SERVICE + "WatchSandbox", request, pb.SandboxEvent.FromString, context
        )

    @staticmethod
    def _done(request: pb.WatchSandboxRequest, record: SandboxRecord) -> bool:
        if request.stop_on_terminal and _terminal(record):
            return True
        return request.stop_on_ready and record.status.phase == Phase.READY

    @unary
    async def ExecSandbox(self, request: pb.ExecSandboxRequest, context: Ctx) -> None:  # type: ignore[override]
        # Written with context.write rather than yield: each write is bounded in time (a client
        # that stops reading ends the exec; see gateway.execs).
        await self._auth.require_client(context)
        with self._execs.counted():
            await self._exec(request, context)

    @unary
    async def ExecSandboxStream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.ExecStreamRequest], context: Ctx
    ) -> None:
        await self._auth.require_client(context)
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("start"):
            raise InvalidArgumentError("start", "the first message of an exec stream must be its start")
        check_terminal_size(first.start.size, "start.size")
        with self._execs.counted():
            await self._exec(first.start.exec, context, interactive=(first.start, request_iterator))

    async def _exec(
        self,
        request: pb.ExecSandboxRequest,
        context: Ctx,
        *,
        interactive: tuple[pb.ExecStreamStart, AsyncIterator[pb.ExecStreamRequest]] | None = None,
    ) -> None:
        _check_exec(request)
        record = await self._lookup(request.workspace, request.name)
        session = self._manager.sessions.get(record.id)
        if session is None and self._forwarder is not None and record.status.phase == Phase.READY:
            target = await self._forwarder.target(record, context)
            if target is not None:
                if interactive is None:
                    upstream = self._forwarder.unary_stream(
                        target, _SERVICE + "ExecSandbox", request, pb.ExecEvent.FromString, context
                    )
                else:  # the start again, then the client's stdin, resizes and signals as they come
                    start, rest = interactive
                    requests = _prepended(pb.ExecStreamRequest(start=start), rest)
                    upstream = self._forwarder.stream_stream(
                        target, _SERVICE + "ExecSandboxStream", requests, pb.ExecEvent.FromString, context
                    )
                # One message at a time: the owner's exec window holds the rest (backpressure).
                async for event in upstream:
                    await context.write(event)
                return
        session = self._servable(record)
        self._manager.touch(record.id)
        try:
            await self._execs.run(session, request, context, interactive=interactive)
        finally:
            self._manager.touch(record.id)  # idle time counts from the end of the last command

    def _servable(self, record: SandboxRecord) -> SupervisorSession:
        """The session an exec in the sandbox goes over; FailedPrecondition when it has none."""
        session = self._manager.sessions.get(record.id)
        if record.status.phase != Phase.READY or session is None:
            metrics.EXECS.labels(result="not_ready").inc()
            raise phases.not_servable(f"{record.workspace}/{record.name}", record.status, operation="exec")
        return session

    async def _elsewhere(self, record: SandboxRecord, context: Ctx) -> Target | None:
        """The replica holding the sandbox's session when it is not this one (calls go there)."""
        if self._forwarder is None or self._manager.sessions.get(record.id) is not None:
            return None
        return await self._forwarder.target(record, context)

    @unary
    async def StartProcess(self, request: pb.StartProcessRequest, context: Ctx) -> pb.ProcessInfo:
        await self._auth.require_client(context)
        _check_exec(request.start.exec)
        check_terminal_size(request.start.size, "start.size")
        record = await self._lookup(request.start.exec.workspace, request.start.exec.name)
        if self._forwarder is not None and (target := await self._elsewhere(record, context)) is not None:
            return await self._forwarder.unary_unary(
                target, _SERVICE + "StartProcess", request, pb.ProcessInfo.FromString, context
            )
        session = self._servable(record)
        self._manager.touch(record.id)
        return self._background.start(record.id, session, request).info()

    @unary
    async def ListProcesses(self, request: pb.SandboxRef, context: Ctx) -> pb.ListProcessesResponse:
        await self._auth.require_client(context)
        record = await self._lookup(request.workspace, request.name)
        if self._forwarder is not None and (target := await self._elsewhere(record, context)) is not None:
            return await self._forwarder.unary_unary(
                target, _SERVICE + "ListProcesses", request, pb.ListProcessesResponse.FromString, context
            )
        processes = self._background.list(record.id, over=_terminal(record))
        return pb.ListProcessesResponse(processes=[p.info() for p in processes])

    @unary
    async def ConnectProcess(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.ExecStreamRequest], context: Ctx
    ) -> None:
        await self._auth.require_client(context)
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("attach"):
            raise InvalidArgumentError("attach", "the first message of ConnectProcess must name the process")
        ref = first.attach
        record = await self._lookup(ref.workspace, ref.name)
        if self._forwarder is not None and (target := await self._elsewhere(record, context)) is not None:
            requests = _prepended(first, request_iterator)
            upstream = self._forwarder.stream_stream(
                target, _SERVICE + "ConnectProcess", requests, pb.ExecEvent.FromString, context
            )
            async for event in upstream:
                await context.write(event)
            return
        process = self._background.get(record.id, ref.pid, over=_terminal(record))
        await self._background.attach(process, context, request_iterator)

    @unary
    async def ListPools(self, request: pb.ListPoolsRequest, context: Ctx) -> pb.ListPoolsResponse:
        await self._auth.require_client(context)
        workspace = None if request.all_workspaces else (request.workspace or DEFAULT_WORKSPACE)
        # An invalid profile has no workspace a listing could filter on: it shows in every one.
        pools = [p for p in self._manager.driver.pools() if workspace is None or p.workspace in (workspace, "")]
        response = pb.ListPoolsResponse(pools=[pool_to_proto(p) for p in pools])
        for reason, count in self._manager.miss_counts().items():
            response.misses_by_reason[reason] = count
        return response

    def _check_ref(self, workspace: str, name: str) -> None:
        validate_workspace(workspace or DEFAULT_WORKSPACE)
        if not name:
            raise InvalidArgumentError("name", "must not be empty")

    async def _lookup(self, workspace: str, name: str) -> SandboxRecord:
        self._check_ref(workspace, name)
        return await self._records.get_by_name(workspace or DEFAULT_WORKSPACE, name)


def _check_exec(request: pb.ExecSandboxRequest) -> None:
    """InvalidArgumentError naming the field for a command the gateway would not run."""
    if not request.command:
        raise InvalidArgumentError("command", "must not be empty")
    validate_command(request.command)
    validate_environment(request.environment)
    if request.timeout_seconds > MAX_EXEC_TIMEOUT_SECONDS:
        raise InvalidArgumentError("timeout_seconds", f"at most {MAX_EXEC_TIMEOUT_SECONDS}")


async def _prepended(
    first: pb.ExecStreamRequest, rest: AsyncIterator[pb.ExecStreamRequest]
) -> AsyncIterator[pb.ExecStreamRequest]:
    """`first`, then what `rest` yields."""
    yield first
    async for request in rest:
        yield request
