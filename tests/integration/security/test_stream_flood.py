"""More concurrent calls on one connection than the gateway allows (its HTTP/2
MAX_CONCURRENT_STREAMS) are refused by the server with RST_STREAM REFUSED_STREAM, which grpcio
passes on as a raw "Received RST_STREAM with error code 7". The SDK says what happened instead:
an `Unavailable` that the call was refused and not started, so it is safe to retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.gateway import listening

CALLS = 3 * listening.MAX_STREAMS_PER_CONNECTION


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(tmp_path / "state", listen_tcp="127.0.0.1:0") as running:
        yield running


async def test_calls_past_the_stream_limit_are_refused_clearly_and_safe_to_retry(gw: RunningGateway) -> None:
    async with warmshell.AsyncClient(f"127.0.0.1:{gw.gateway.tcp_port}", gw.token) as client:
        await client.list()  # connected, and the server's SETTINGS known
        answers = await asyncio.gather(*(client.list() for _ in range(CALLS)), return_exceptions=True)
        failures = [a for a in answers if isinstance(a, BaseException)]
        # The burst goes past the limit (grpcio does not queue what the server will not take).
        assert failures, "no call was refused: the attack no longer reproduces"
        for failure in failures:
            assert isinstance(failure, warmshell.Unavailable), repr(failure)
            assert "refused the call" in failure.details, failure
            assert "safe to retry" in failure.details, failure
            assert "RST_STREAM" not in str(failure)
            assert "warmshell gateway start" not in str(failure)  # it is running
        # Retried one at a time, every refused call succeeds.
        for _ in failures:
            await client.list()
