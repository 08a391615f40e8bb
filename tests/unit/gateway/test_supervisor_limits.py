"""RegisterSupervisor and RefreshSandboxToken under a loop of one credential: the burst goes
through, then RESOURCE_EXHAUSTED (counted in a metric), and the driver's registration effects
happen only for the registrations that went through. A whole gateway on real sockets, with the
fake driver (its credentials are known to the test)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.core.config import load_config
from warmshell.core.ids import SandboxId
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway import metrics
from warmshell.gateway.server import Gateway

BURST = 3
REFUSAL_DELAY = 0.05


@pytest.fixture
async def served() -> AsyncIterator[tuple[Gateway, FakeDriver, supervisor_pb2_grpc.SupervisorServiceStub]]:
    with tempfile.TemporaryDirectory(prefix="ws-limits-") as tmp:  # short: AF_UNIX paths
        settings = {
            "state_dir": str(Path(tmp) / "state"),
            "http_port": 0,
            "rate_limits.registration.per_second": 0.01,
            "rate_limits.registration.burst": BURST,
            "rate_limits.token_refresh.per_second": 0.01,
            "rate_limits.token_refresh.burst": BURST,
            "rate_limits.refusal_delay_seconds": REFUSAL_DELAY,
        }
        config = load_config(None, settings)
        driver = FakeDriver()
        gateway = Gateway(config, driver)
        await gateway.start()
        channel = grpc.aio.insecure_channel(f"unix://{config.paths.supervisor_socket}")
        try:
            yield gateway, driver, supervisor_pb2_grpc.SupervisorServiceStub(channel)
        finally:
            await channel.close(grace=None)
            await gateway.stop()


def _limited(call: str) -> float:
    return metrics.REGISTRY.get_sample_value("warmshell_rate_limited_total", {"call": call}) or 0.0


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_looped_registration_is_rate_limited(
    served: tuple[Gateway, FakeDriver, supervisor_pb2_grpc.SupervisorServiceStub],
) -> None:
    gateway, driver, stub = served
    credential = driver.add_warm_instance()
    before = _limited("registration")
    request = spb.RegisterSupervisorRequest(bootstrap_credential=credential)
    outcomes: list[grpc.StatusCode | str] = []
    for _ in range(BURST + 5):
        call = stub.RegisterSupervisor(request)
        seen = len(driver.identity.registrations)
        # One at a time: each call is either parked (the driver saw a registration) or refused.
        await _until(lambda: call.done() or len(driver.identity.registrations) > seen)  # noqa: B023
        outcomes.append(await call.code() if call.done() else "parked")
        call.cancel()
    assert outcomes == ["parked"] * BURST + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5
    assert len(driver.identity.registrations) == BURST, "refused registrations have no driver effect"
    assert _limited("registration") - before == 5
    await _until(lambda: gateway.parts.registry.pending_count() == 0)


async def test_a_looped_token_refresh_is_rate_limited(
    served: tuple[Gateway, FakeDriver, supervisor_pb2_grpc.SupervisorServiceStub],
) -> None:
    gateway, _, stub = served
    token, _ = gateway.parts.issuer.mint(SandboxId("sbx-1"), "i-1")
    metadata = (("authorization", f"Bearer {token}"),)
    before = _limited("token_refresh")
    codes = []
    for _ in range(BURST + 2):
        started = time.monotonic()
        try:
            await stub.RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=metadata)
            codes.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as exc:
            codes.append(exc.code())
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # a refusal is not instant
                assert time.monotonic() - started >= REFUSAL_DELAY
    # The sandbox is not in the store: admitted refreshes end NOT_FOUND, the rest are limited.
    assert codes == [grpc.StatusCode.NOT_FOUND] * BURST + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert "too many token refreshes of instance i-1" in details
    assert _limited("token_refresh") - before == 2
