"""Secrets and accepted environment on the local driver, end to end with a real gateway and real
sandboxes: a request with per-task values and a secret goes warm, the workload and an exec see
them, and the secret's value is found nowhere the gateway writes or shows (store, WAL, state dir,
debug log, /metrics, get/list)."""

from __future__ import annotations

import asyncio
import base64
import logging
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from tests.integration.gateway.test_warm_pools import idle, reason_of, write_profile
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli import render

SECRET = "s3cr3t-7f1c9e"  # distinctive, so a grep cannot hit it by chance
PROFILE = """version = 1
workspace = "default"
replicas = 2
[environment]
FOO = "bar"
[activation]
environment = ["TASK_*"]
"""
SHOW = ["sh", "-c", 'echo "$FOO $TASK_ID $API_KEY"']


def _encodings(value: str) -> list[bytes]:
    raw = value.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw), base64.b64encode(raw).rstrip(b"=")]


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def _files_holding(root: Path, needles: list[bytes]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                found.append(str(path))
    return found


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    pools = tmp_path / "pools"
    write_profile(pools, "tasks", PROFILE)
    async with running_gateway(
        tmp_path / "state",
        log_level="DEBUG",
        **{"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1},
    ) as running:
        yield running


async def test_secret_and_accepted_key_go_warm_and_the_secret_is_nowhere_else(
    gw: RunningGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    pools = await wait_pools(gw, idle("tasks", 2))
    tasks = pool_named(pools, "tasks")
    assert tasks is not None
    assert list(tasks.accepted_environment) == ["TASK_*"]

    spec = pb.SandboxSpec(
        environment={"FOO": "bar", "TASK_ID": "9"},
        secrets={"API_KEY": SECRET},
        command=[*SHOW[:2], SHOW[2] + "; sleep 60"],
    )
    created = await gw.create(name="t1", spec=spec)
    assert created.status.allocation == "warm"
    ready = await gw.wait_ready("t1")
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    assert ready.status.pool == "tasks"
    assert list(ready.status.injected_environment) == ["TASK_ID"]
    assert reason_of(ready) == ("PoolHit", "tasks (accepted at activation: TASK_ID)")
    assert dict(ready.spec.secrets) == {"API_KEY": "<redacted>"}

    code, out, _ = await gw.exec("t1", SHOW)
    assert (code, out) == (0, f"bar 9 {SECRET}\n".encode())
    workload = b""
    request = pb.WatchSandboxRequest(name="t1", follow_output=True)
    async for event in gw.stub.WatchSandbox(request, metadata=gw.metadata):
        if event.HasField("output"):
            workload += event.output.data
            if b"\n" in workload:
                break
    assert workload == f"bar 9 {SECRET}\n".encode()

    # Another value of a baked key still misses; a second sandbox from the pool has no secret.
    cold_spec = pb.SandboxSpec(environment={"FOO": "baz", "TASK_ID": "9"}, secrets={"API_KEY": SECRET})
    await gw.create(name="cold", spec=cold_spec)
    assert reason_of(await gw.wait_ready("cold")) == ("PoolMiss", "NoMatch")
    assert await gw.exec("cold", SHOW) == (0, f"baz 9 {SECRET}\n".encode(), b"")  # cold: the same delivery
    await wait_pools(gw, idle("tasks", 1))
    other = await gw.create(name="t2", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
    assert other.status.allocation == "warm"
    await gw.wait_ready("t2")
    assert await gw.exec("t2", SHOW) == (0, b"bar  \n", b"")

    needles = _encodings(SECRET)
    listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
    shown = render.to_json(listed) + render.to_json(await gw.get("t1"))
    assert not any(n.decode() in shown for n in needles)
    metrics = await asyncio.to_thread(_read, f"http://127.0.0.1:{gw.gateway.http_port}/metrics")
    assert b"warmshell_sandbox_creates_total" in metrics
    assert not any(n in metrics for n in needles)
    logged = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
    assert "activated instance" in logged  # the debug lines were captured
    assert not any(n.decode() in logged for n in needles)
    state = tmp_path / "state"
    assert (state / "warmshell.db-wal").exists() or (state / "warmshell.db").exists()
    assert _files_holding(state, needles) == []

    # Deleting the sandbox deletes its sealed secrets.
    store = gw.gateway.parts.store
    assert await store.get("sealed-secrets", ready.id) is not None
    await gw.delete("t1")
    assert await store.get("sealed-secrets", ready.id) is None


async def test_bad_secrets_are_refused_naming_the_field(gw: RunningGateway) -> None:
    import grpc

    cases = [
        ({"1BAD": "x"}, {}, "spec.secrets['1BAD']"),
        ({"FOO": "x"}, {"FOO": "y"}, "is also set in spec.environment"),
        ({"BIG": "x" * (65 * 1024)}, {}, "at most 65536"),
    ]
    for secrets, env, expected in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.create(name="bad", spec=pb.SandboxSpec(environment=env, secrets=secrets))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert expected in (caught.value.details() or "")
        assert "x" * 16 not in (caught.value.details() or "")
    listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=gw.metadata)
    assert [s.name for s in listed.sandboxes] == []
