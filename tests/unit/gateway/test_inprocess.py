"""The in-process transport on its own: calls reach the handlers with the caller's token as
metadata, a handler's abort comes back as the AioRpcError a socket call would raise, a session's
handler runs in its own task and is cancelled when the supervisor ends it, and a registration is
run to its end as a server runs it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.gateway.auth import bearer_token
from warmshell.gateway.inprocess import InProcessLink


class Handlers:
    """Stands in for SupervisorService: records what the link handed it."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.ended: list[str] = []
        self.handler_tasks: list[asyncio.Task[Any] | None] = []
        self.refuse: grpc.StatusCode | None = None
        self.crash = False

    async def RegisterSupervisor(self, request: spb.RegisterSupervisorRequest, context: Any) -> AsyncIterator[Any]:
        try:
            if self.refuse is not None:
                await context.abort(self.refuse, "refused here")
            yield spb.SupervisorActivationMessage(sandbox_id="sb-1")
        finally:
            self.ended.append("register")

    async def ConnectSupervisor(
        self, requests: AsyncIterator[spb.SupervisorMessage], context: Any
    ) -> AsyncIterator[Any]:
        self.tokens.append(bearer_token(context))
        self.handler_tasks.append(asyncio.current_task())
        try:
            if self.refuse is not None:
                await context.abort(self.refuse, "refused here")
            first = await anext(aiter(requests))
            yield spb.GatewayMessage(accepted=spb.SessionAccepted(session_id=first.hello.sandbox_id))
            await asyncio.Event().wait()
        finally:
            self.ended.append("session")

    async def RefreshSandboxToken(self, request: spb.RefreshSandboxTokenRequest, context: Any) -> Any:
        if self.crash:
            raise RuntimeError("a bug quoting secret-value")
        return spb.RefreshSandboxTokenResponse(token=bearer_token(context) + "-new")


async def _hello() -> AsyncIterator[spb.SupervisorMessage]:
    yield spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id="sb-1"))


def link_over(handlers: Handlers) -> InProcessLink:
    return InProcessLink(handlers)  # type: ignore[arg-type]


async def test_a_registration_runs_to_its_end_before_the_activation_is_returned() -> None:
    handlers = Handlers()
    activation = await link_over(handlers).register(spb.RegisterSupervisorRequest())
    assert activation is not None
    assert activation.sandbox_id == "sb-1"
    assert handlers.ended == ["register"]


async def test_an_abort_is_the_status_a_socket_call_would_raise() -> None:
    handlers = Handlers()
    handlers.refuse = grpc.StatusCode.UNAUTHENTICATED
    link = link_over(handlers)
    with pytest.raises(grpc.aio.AioRpcError) as registered:
        await link.register(spb.RegisterSupervisorRequest())
    assert (registered.value.code(), registered.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, "refused here")
    handlers.refuse = grpc.StatusCode.PERMISSION_DENIED
    call = link.connect(_hello(), "tok")
    with pytest.raises(grpc.aio.AioRpcError) as connected:
        await anext(aiter(call))
    assert connected.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(StopAsyncIteration):  # a finished call stays finished
        await anext(aiter(call))


async def test_a_session_runs_in_its_own_task_and_cancelling_it_ends_the_handler() -> None:
    handlers = Handlers()
    link = link_over(handlers)
    call = link.connect(_hello(), "the-token")
    accepted = await anext(aiter(call))
    assert accepted.accepted.session_id == "sb-1"
    assert handlers.tokens == ["the-token"]
    assert handlers.handler_tasks[0] is not asyncio.current_task()
    call.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await anext(aiter(call))
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    assert handlers.ended == ["session"]


async def test_refresh_carries_the_token_and_aclose_ends_open_sessions() -> None:
    handlers = Handlers()
    link = link_over(handlers)
    assert (await link.refresh_token("abc")).token == "abc-new"
    call = link.connect(_hello(), "t")
    await anext(aiter(call))
    await link.aclose()
    assert handlers.ended == ["session"]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await link.refresh_token("abc")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_bug_escaping_a_handler_is_unknown_and_logged_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handlers = Handlers()
    handlers.crash = True
    with (
        caplog.at_level(logging.ERROR, logger="warmshell.gateway.inprocess"),
        pytest.raises(grpc.aio.AioRpcError) as caught,
    ):
        await link_over(handlers).refresh_token("abc")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert "RuntimeError" in caplog.text
    assert "secret-value" not in caplog.text
