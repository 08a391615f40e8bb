"""The supervisor API called in process: how a local sandbox's host-side supervisor reaches the
gateway it runs in, without HTTP/2, serialisation or gRPC call objects.

The calls go to the very `SupervisorService` handlers the sockets serve, with a context carrying
the same metadata a gRPC call would (the sandbox token as a bearer token), so registration is
checked against the bootstrap credential, sessions against the token and the hello, and rate
limits apply exactly as over a socket; a refusal comes back as the `grpc.aio.AioRpcError` a
socket call would raise (`supervisor.link`). Messages are passed as they are: neither side
changes a message once it has sent it. A session's handler runs in a task of its own, as a
server runs it, so a supervisor that goes away cancels it and the gateway's clean-up does not
run in the supervisor's task. Only the gateway process can reach this: it is an object, not a
socket, and a sandbox's workload runs in another process. No `max_request_bytes` applies, as it
would on a socket: the messages are made by the supervisor's own code, whose output chunks are
reads of at most 64 KiB, and its outbox bounds how many wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import NoReturn, Protocol, runtime_checkable

import grpc

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.gateway.supervisor_service import SupervisorService
from warmshell.sandboxio.link import GatewayLink

__all__ = ["HostsSupervisors", "InProcessLink"]

log = logging.getLogger(__name__)

_STOPPED = "the gateway is shutting down"


@runtime_checkable
class HostsSupervisors(Protocol):
    """A driver that runs supervisors inside the gateway process (the local driver)."""

    def supervise_in_process(self, link: GatewayLink) -> None:
        """Reach the gateway through `link` from now on instead of its supervisor socket."""
        ...


class _Aborted(grpc.aio.AbortError):
    """A handler ended its call with a status (what `context.abort` raises in process)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


@contextlib.contextmanager
def _as_status() -> Iterator[None]:
    """A handler's abort as the AioRpcError a socket call would raise; anything else escaping a
    handler (they turn every error into a status, so: a bug) as UNKNOWN, which is what a server
    answers then, logged by its class alone as `calls` does (its text may quote a credential)."""
    try:
        yield
    except _Aborted as aborted:
        raise _rpc_error(aborted.code, aborted.details) from None
    except Exception as exc:
        log.error("in-process supervisor call failed: %s", type(exc).__qualname__)
        raise _rpc_error(grpc.StatusCode.UNKNOWN, "unexpected error in the gateway") from None


@dataclass(frozen=True)
class _Context:
    """The context of one in-process call (see `gateway.context.CallContext`)."""

    metadata: grpc.aio.Metadata

    def invocation_metadata(self) -> grpc.aio.Metadata:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise _Aborted(code, details)


def _context(token: str = "") -> _Context:
    return _Context(grpc.aio.Metadata(("authorization", f"Bearer {token}")) if token else grpc.aio.Metadata())


@dataclass(frozen=True)
class _End:
    error: grpc.aio.AioRpcError | None = None


class _Session:
    """One in-process ConnectSupervisor: its handler in a task, its messages through a queue
    (unbounded, like the session outbox that feeds it: what bounds it bounds this too)."""

    def __init__(self, stream: AsyncIterator[spb.GatewayMessage]) -> None:
        self._messages: asyncio.Queue[spb.GatewayMessage | _End] = asyncio.Queue()
        self.task = asyncio.create_task(self._pump(stream), name="supervisor-session")
        self._ended = False

    async def _pump(self, stream: AsyncIterator[spb.GatewayMessage]) -> None:
        end = _End()
        try:
            with _as_status():
                async for message in stream:
                    self._messages.put_nowait(message)
        except grpc.aio.AioRpcError as error:
            end = _End(error)
        except asyncio.CancelledError:
            end = _End(_rpc_error(grpc.StatusCode.CANCELLED, "cancelled"))
            raise
        finally:
            self._messages.put_nowait(end)

    def __aiter__(self) -> _Session:
        return self

    async def __anext__(self) -> spb.GatewayMessage:
        if self._ended:
            raise StopAsyncIteration
        item = await self._messages.get()
        if isinstance(item, _End):
            self._ended = True
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        return item

    def cancel(self) -> bool:
        return self.task.cancel()


class InProcessLink:
    """`supervisor.link.GatewayLink` straight into the gateway's `SupervisorService`.

    `close` is the in-process half of a server's stop: new calls are refused with UNAVAILABLE
    (a supervisor then retries, as it does against a stopped socket); `aclose` also ends the
    session handlers still running."""

    def __init__(self, service: SupervisorService) -> None:
        self._service = service
        self._sessions: set[asyncio.Task[None]] = set()
        self._closed = False

    def _refuse_when_closed(self) -> None:
        if self._closed:
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, _STOPPED)

    async def register(self, request: spb.RegisterSupervisorRequest) -> spb.SupervisorActivationMessage | None:
        """See `GatewayLink.register`. Runs the handler to its end, as a server does, in the
        caller's task: cancelling the caller cancels the registration."""
        self._refuse_when_closed()
        activation = None
        with _as_status():
            async for message in self._service.RegisterSupervisor(request, _context()):
                activation = activation or message
        return activation

    def connect(self, requests: AsyncIterator[spb.SupervisorMessage], token: str) -> _Session:
        """See `GatewayLink.connect`."""
        self._refuse_when_closed()
        session = _Session(self._service.ConnectSupervisor(requests, _context(token)))
        self._sessions.add(session.task)
        session.task.add_done_callback(self._sessions.discard)
        return session

    async def refresh_token(self, token: str) -> spb.RefreshSandboxTokenResponse:
        """See `GatewayLink.refresh_token`."""
        self._refuse_when_closed()
        with _as_status():
            return await self._service.RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), _context(token))

    def close(self) -> None:
        """Refuse new calls from now on."""
        self._closed = True

    async def aclose(self) -> None:
        """Refuse new calls and end the session handlers still running."""
        self.close()
        sessions = list(self._sessions)
        for task in sessions:
            task.cancel()
        await asyncio.gather(*sessions, return_exceptions=True)
