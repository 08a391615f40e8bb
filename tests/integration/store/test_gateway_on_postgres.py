"""A real gateway on a real Postgres: sandboxes work, an outage is reported on `/healthz` and as
UNAVAILABLE in words a user understands, and the gateway recovers by itself when Postgres returns."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path

import aiohttp
import grpc
import pytest

from tests.helpers.cli import start_gateway, warmshell_env, warmshell_executable
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.postgres import DevPostgres
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.ids import SandboxId
from warmshell.gateway.store import opening

RECOVERY_TIMEOUT_SECONDS = 30.0


def _store_overrides(server: DevPostgres) -> dict[str, object]:
    return {
        "store.url": server.url,
        "store.password_file": str(server.password_file),
        "store.connect_timeout_seconds": 2.0,
        "store.startup_timeout_seconds": 5.0,
    }


async def _healthz(gw: RunningGateway) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{gw.gateway.http_port}/healthz") as response,
    ):
        return response.status, await response.text()


async def _wait_healthy(gw: RunningGateway) -> None:
    # /healthz has no watch: poll it, as a kubelet's readiness probe does.
    async with asyncio.timeout(RECOVERY_TIMEOUT_SECONDS):
        while (await _healthz(gw))[0] != 200:
            await asyncio.sleep(0.2)


async def _wait_until(condition: Callable[[], bool]) -> None:
    # Session tables have no watch: poll them, bounded.
    async with asyncio.timeout(RECOVERY_TIMEOUT_SECONDS):
        while not condition():
            await asyncio.sleep(0.05)


async def test_gateway_survives_a_postgres_restart(
    tmp_path: Path, own_postgres: DevPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_gateway(tmp_path / "state", **_store_overrides(own_postgres)) as gw:
        before = await gw.create(name="before")
        assert (await gw.wait_ready("before")).status.phase == pb.SANDBOX_PHASE_READY
        assert await _healthz(gw) == (200, "ok\n")
        manager = gw.gateway.parts.manager
        sandbox_id = SandboxId(before.id)

        own_postgres.stop(keep=True)
        status, body = await _healthz(gw)
        assert status == 503
        assert "not serving" in body
        assert "unreachable" in body
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        details = caught.value.details() or ""
        assert "the store (Postgres at 127.0.0.1:" in details
        assert "Unexpected" not in details
        assert "internal error" not in details
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.create(name="during")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        # A session that ends now cannot be recorded as ended, and its supervisor's reconnects
        # are refused until the store is back.
        session = manager.sessions.get(sandbox_id)
        assert session is not None
        session.close("test: drop the session during the outage", reconnect=True)
        await _wait_until(lambda: manager.sessions.get(sandbox_id) is not session)

        own_postgres.restart()
        await _wait_healthy(gw)
        assert all(not task.done() for task in gw.gateway.background), "a background loop died during the outage"
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
        assert [s.name for s in listed.sandboxes] == ["before"]  # the refused create left nothing
        await gw.create(name="after")
        assert (await gw.wait_ready("after")).status.phase == pb.SANDBOX_PHASE_READY
        await _wait_until(lambda: manager.sessions.live(sandbox_id) not in (None, session))  # reconnected
        ready = await gw.wait_ready("before", timeout=RECOVERY_TIMEOUT_SECONDS)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        async with asyncio.timeout(RECOVERY_TIMEOUT_SECONDS):
            code, out, _ = await gw.exec("before", ["echo", "still here"])
        assert (code, out) == (0, b"still here\n")
    # No handler let an exception through to grpc (which logs "Unexpected [...] raised by servicer").
    assert not [r.getMessage() for r in caplog.records if "Unexpected" in r.getMessage()]


def test_the_password_is_never_logged(tmp_path: Path, own_postgres: DevPostgres) -> None:
    """A gateway process at DEBUG, password from a file and then from the environment."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[store]\nurl = "{own_postgres.url}"\npassword_file = "{own_postgres.password_file}"\n'
        "startup_timeout_seconds = 5.0\n"
    )
    gateway = start_gateway(tmp_path / "state", "--config", str(config), "--log-level", "DEBUG")
    try:
        listed = gateway.run("sandbox", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
    finally:
        assert gateway.stop() == 0
    log = gateway.log()
    assert "applied schema migrations" in log  # the store did log, and at DEBUG
    assert own_postgres.password not in log

    # A wrong password from the environment: a clear start-up error that echoes neither the
    # given password nor the real one.
    config.write_text(f'[store]\nurl = "{own_postgres.url}"\n')
    failed = subprocess.run(
        [
            warmshell_executable(),
            "gateway",
            "start",
            "--config",
            str(config),
            "--http-port",
            "0",
            "--log-level",
            "DEBUG",
        ],
        env={**warmshell_env(tmp_path / "state"), opening.PASSWORD_ENV: "wrong-password-123"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert "refused this gateway" in output
    assert "Unexpected" not in output
    assert "wrong-password-123" not in output
    assert own_postgres.password not in output
