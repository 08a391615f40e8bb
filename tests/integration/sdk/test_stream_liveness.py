"""A stream on a gateway that stopped answering ends with an error, never hangs: a frozen gateway
(SIGSTOP) is found by the clients' keepalive PINGs within KEEPALIVE_SECONDS +
KEEPALIVE_TIMEOUT_SECONDS, a killed one (SIGKILL) at once; the sync client on both transports and
the async client, each mid-stream on a silent command (a real gateway process)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.cli import CliGateway, start_gateway
from warmshell.sdk import http2

pytestmark = pytest.mark.timeout(120)

SILENT = ["sh", "-c", "echo started; exec sleep 600"]  # says it runs, then nothing for ten minutes
# The stated bound, plus room for a loaded 2-core machine to schedule the failing call.
BOUND_SECONDS = http2.KEEPALIVE_SECONDS + http2.KEEPALIVE_TIMEOUT_SECONDS
SLACK_SECONDS = 8.0


@pytest.fixture
def lone_gateway(tmp_path: Path) -> Iterator[CliGateway]:
    """A gateway of this test's own: it is frozen or killed."""
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is required: apt-get install bubblewrap"
    running = start_gateway(tmp_path / "state")
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.send_signal(signal.SIGCONT)
        running.stop()


def _sync_stream(gateway: CliGateway, transport: str, started: concurrent.futures.Future[None]) -> float:
    """Read a silent command's stream until it fails; when it failed (time.monotonic())."""
    with warmshell.Client(state_dir=gateway.state_dir, transport=transport) as client:
        try:
            for event in client.get("quiet").run_stream(SILENT):
                if event.stdout:
                    started.set_result(None)
        except warmshell.Unavailable:
            return time.monotonic()
    raise AssertionError(f"the stream on {transport} ended without an error")


def _async_stream(gateway: CliGateway, started: concurrent.futures.Future[None]) -> float:
    async def follow() -> float:
        async with warmshell.AsyncClient(state_dir=gateway.state_dir) as client:
            sandbox = await client.get("quiet")
            try:
                async for event in sandbox.run_stream(SILENT):
                    if event.stdout:
                        started.set_result(None)
            except warmshell.Unavailable:
                return time.monotonic()
        raise AssertionError("the async stream ended without an error")

    return asyncio.run(follow())


def _streams_fail_after(gateway: CliGateway, stop: Callable[[], None]) -> list[float]:
    """Three streams on a silent command (grpcio, http2, async), then `stop`: how long after it
    each one failed."""
    with warmshell.Client(state_dir=gateway.state_dir) as client:
        client.create(name="quiet")
    starts = [concurrent.futures.Future[None]() for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        ends = [
            pool.submit(_sync_stream, gateway, "grpcio", starts[0]),
            pool.submit(_sync_stream, gateway, "http2", starts[1]),
            pool.submit(_async_stream, gateway, starts[2]),
        ]
        concurrent.futures.wait(starts, timeout=60)
        assert all(s.done() for s in starts), [e.exception() for e in ends if e.done()]
        stopped = time.monotonic()
        stop()
        return [end.result(timeout=BOUND_SECONDS + SLACK_SECONDS + 30) - stopped for end in ends]


def test_a_frozen_gateway_fails_every_stream_within_the_keepalive_bound(lone_gateway: CliGateway) -> None:
    took = _streams_fail_after(lone_gateway, lambda: lone_gateway.process.send_signal(signal.SIGSTOP))
    # Not before a keepalive interval of silence: a silent command alone never ends a stream.
    assert all(http2.KEEPALIVE_SECONDS - 1 < t < BOUND_SECONDS + SLACK_SECONDS for t in took), took


def test_a_killed_gateway_fails_every_stream_at_once(lone_gateway: CliGateway) -> None:
    def kill() -> None:
        lone_gateway.process.kill()
        lone_gateway.process.wait()

    took = _streams_fail_after(lone_gateway, kill)
    assert all(t < SLACK_SECONDS for t in took), took
