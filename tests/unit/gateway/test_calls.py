"""Every exception a handler raises becomes a status: domain errors with their own code and text,
anything else INTERNAL with a plain sentence (the traceback, without the exception's text, goes
to the log), while cancellation and a status the handler set itself pass through."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from warmshell.core.errors import NotFoundError
from warmshell.gateway.auth import Unauthenticated
from warmshell.gateway.calls import INTERNAL_MESSAGE, HeldStream, streaming, unary

SECRET = "sk-do-not-log-me"


class Aborted(Exception):
    """What the fake context raises from abort (grpc raises its AbortError)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class FakeContext:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class Handlers:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    @unary
    async def Unary(self, request: object, context: Any) -> str:
        raise self.exc

    @streaming
    async def Streaming(self, request: object, context: Any) -> AsyncIterator[str]:
        yield "first"
        raise self.exc


async def call(exc: BaseException, *, stream: bool) -> None:
    """Run the handler that raises `exc` to its end."""
    handlers = Handlers(exc)
    if stream:
        async for _ in handlers.Streaming(None, FakeContext()):
            pass
    else:
        await handlers.Unary(None, FakeContext())


async def status_of(exc: BaseException, *, stream: bool) -> Aborted:
    with pytest.raises(Aborted) as aborted:
        await call(exc, stream=stream)
    return aborted.value


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unexpected_exception_is_internal_with_a_plain_message(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="warmshell.gateway.calls")
    aborted = await status_of(KeyError(f"token={SECRET}"), stream=stream)
    assert aborted.code == grpc.StatusCode.INTERNAL
    assert aborted.details == INTERNAL_MESSAGE
    assert "KeyError" not in aborted.details
    logged = caplog.text
    assert "KeyError" in logged
    assert ("Handlers.Streaming" if stream else "Handlers.Unary") in logged
    assert "raise self.exc" in logged  # the traceback's frames
    assert SECRET not in logged  # but not the exception's text


@pytest.mark.parametrize("stream", [False, True])
async def test_domain_errors_keep_their_code_and_message(stream: bool) -> None:
    aborted = await status_of(NotFoundError("sandbox default/x not found"), stream=stream)
    assert (aborted.code, aborted.details) == (grpc.StatusCode.NOT_FOUND, "sandbox default/x not found")
    aborted = await status_of(Unauthenticated("missing or invalid API token"), stream=stream)
    assert aborted.code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("stream", [False, True])
async def test_cancellation_and_a_status_set_by_the_handler_pass_through(stream: bool) -> None:
    with pytest.raises(asyncio.CancelledError):
        await call(asyncio.CancelledError(), stream=stream)
    with pytest.raises(grpc.aio.AbortError):
        await call(grpc.aio.AbortError(), stream=stream)


async def test_a_held_stream_keeps_the_message_a_cancelled_reader_waited_for() -> None:
    """A reader cancelled while it waits for the next message (a session's reader, an exec's
    stdin relay, as their call fails) leaves the stream readable, from that very message on:
    the drain before the status reads what the caller still sends."""
    arrived: asyncio.Queue[int | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[int]:
        while (item := await arrived.get()) is not None:
            yield item

    stream = HeldStream(requests())
    arrived.put_nowait(1)
    assert await anext(stream) == 1
    reader = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)  # the reader now waits for message 2
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    arrived.put_nowait(2)
    arrived.put_nowait(3)
    arrived.put_nowait(None)
    assert [item async for item in stream] == [2, 3]


async def test_a_plain_async_generator_is_closed_by_a_cancelled_reader() -> None:
    """Why the stream is held: grpcio's request stream is an async generator, which a reader
    cancelled mid-wait closes (the drain then read nothing and the status raced the writes)."""
    arrived: asyncio.Queue[int | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[int]:
        while (item := await arrived.get()) is not None:
            yield item

    stream = requests()
    reader = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    arrived.put_nowait(2)
    assert [item async for item in stream] == []
