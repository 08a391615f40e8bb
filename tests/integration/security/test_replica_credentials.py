"""The replicas' shared token and the forwarding path, attacked on one real gateway on Postgres
(a replica: it loads the replica token and accepts forwarded calls) with real sandboxes.

The replica token makes a call a forwarded client call. It must open nothing else: not the
supervisor API (registering, a session, a token refresh), and the `x-warmshell-forwarded-by`
header that forwarded calls carry must lend no authority to whatever credential comes with it
(a sandbox's token, which a workload on Kubernetes can read, or none). The token is never in a
log line, the sandbox, or a child's environment. `tests/integration/replicas/` covers a wrong
replica token and a copied sandbox token on the replica not holding the session.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.helpers.postgres import DevPostgres
from tests.integration.security.support import sandbox, sh, still_real
from tests.integration.security.test_store_credentials import _descendants
from tests.integration.store.conftest import dev_postgres  # noqa: F401
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc, supervisor_pb2_grpc
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.ids import SandboxId
from warmshell.gateway.auth import FORWARDED_BY
from warmshell.gateway.tokens import SandboxTokenIssuer, load_or_create_signing_key

pytestmark = pytest.mark.timeout(180)

REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


@pytest.fixture
async def gw(
    tmp_path: Path,
    dev_postgres: DevPostgres,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> AsyncIterator[RunningGateway]:
    url = await dev_postgres.create_database()
    caplog.set_level(logging.DEBUG)
    try:
        async with running_gateway(
            tmp_path / "state",
            listen_tcp="127.0.0.1:0",
            **{"store.url": url, "store.password_file": str(dev_postgres.password_file)},
        ) as running:
            yield running
    finally:
        await dev_postgres.drop_database(url)


def replica_token(gw: RunningGateway) -> str:
    token = gw.gateway.paths.replica_token.read_text().strip()
    assert len(token) >= 32
    return token


async def _outcome(call: Awaitable[object]) -> grpc.StatusCode:
    try:
        async with asyncio.timeout(10):
            await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    except TimeoutError:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.OK


def _drain(call: Any) -> Awaitable[object]:
    async def run() -> object:
        return [message async for message in call]

    return run()


async def gw_exec(gw: RunningGateway, name: str, command: list[str]) -> tuple[int, str, str]:
    code, out, err = await gw.exec(name, command)
    return code, out.decode(errors="replace"), err.decode(errors="replace")


async def test_the_replica_token_opens_no_supervisor_rpc(gw: RunningGateway) -> None:
    victim = await sandbox(gw, "victim")
    token = replica_token(gw)
    md = (("authorization", f"Bearer {token}"), (FORWARDED_BY, "gw-peer"))
    hello = spb.SupervisorMessage(
        hello=spb.SupervisorHello(sandbox_id=victim.id, instance_id=victim.status.instance_id, workload_started=True)
    )

    async def messages() -> AsyncIterator[spb.SupervisorMessage]:
        yield hello

    for target in (f"127.0.0.1:{gw.gateway.tcp_port}", f"unix://{gw.gateway.paths.supervisor_socket}"):
        async with grpc.aio.insecure_channel(target) as channel:
            stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
            attempts: dict[str, Awaitable[object]] = {
                "RegisterSupervisor(credential)": _drain(
                    stub.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=token))
                ),
                "RegisterSupervisor(metadata)": _drain(
                    stub.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=token), metadata=md)
                ),
                "ConnectSupervisor": _drain(stub.ConnectSupervisor(messages(), metadata=md)),
                "RefreshSandboxToken": stub.RefreshSandboxToken(spb.RefreshSandboxTokenRequest(), metadata=md),
            }
            for name, attempt in attempts.items():
                assert await _outcome(attempt) in REFUSED, (target, name)
    after = await gw.get("victim")
    assert after.status.instance_id == victim.status.instance_id
    assert after.status.phase == pb.SANDBOX_PHASE_READY
    await still_real(gw, "victim")


async def test_the_forwarded_by_header_lends_no_authority(gw: RunningGateway) -> None:
    """A workload that holds its sandbox's token (readable on Kubernetes) adds the header that
    forwarded calls carry: still a sandbox principal, refused on every public RPC; and the header
    with no credential, or with the replica token cut or extended, is no client."""
    victim = await sandbox(gw, "victim")
    key = load_or_create_signing_key(gw.gateway.paths.signing_key)
    gateway_id = (gw.gateway.paths.root / "gateway-id").read_text().strip()
    sandbox_token, _ = SandboxTokenIssuer(key, gateway_id=gateway_id, ttl_seconds=600).mint(
        SandboxId(victim.id), victim.status.instance_id
    )
    token = replica_token(gw)
    credentials = {
        "sandbox token": (("authorization", f"Bearer {sandbox_token}"), (FORWARDED_BY, "gw-peer")),
        "no token": ((FORWARDED_BY, "gw-peer"),),
        "header as the token": (("authorization", "Bearer gw-peer"), (FORWARDED_BY, "gw-peer")),
        "replica token cut": (("authorization", f"Bearer {token[:-1]}"), (FORWARDED_BY, "gw-peer")),
        "replica token plus a byte": (("authorization", f"Bearer {token}A"), (FORWARDED_BY, "gw-peer")),
    }
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.gateway.tcp_port}") as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        files = sandbox_pb2_grpc.FileServiceStub(channel)
        for label, md in credentials.items():
            calls: dict[str, Awaitable[object]] = {
                "ExecSandbox": _drain(
                    stub.ExecSandbox(
                        pb.ExecSandboxRequest(name="victim", command=["touch", "/workspace/pwned"]), metadata=md
                    )
                ),
                "ListSandboxes": stub.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=md),
                "DeleteSandbox": stub.DeleteSandbox(pb.SandboxRef(name="victim"), metadata=md),
                "ReadFile": _drain(files.ReadFile(pb.FileRef(name="victim", path="/workspace/x"), metadata=md)),
            }
            for name, call in calls.items():
                assert await _outcome(call) in REFUSED, (label, name)
    assert (await sh(gw, "victim", "test -e /workspace/pwned; echo $?"))[1].strip() == "1"
    await still_real(gw, "victim")


async def test_the_replica_token_is_in_no_log_no_sandbox_and_no_childs_environment(
    gw: RunningGateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = replica_token(gw)
    await sandbox(gw, "victim")
    # Used (a forwarded call) and misused (on the supervisor API), so every path that could log it runs.
    md = (("authorization", f"Bearer {token}"), (FORWARDED_BY, "gw-peer"))
    listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=md)
    assert [s.name for s in listed.sandboxes] == ["victim"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.gateway.tcp_port}") as channel:
        stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
        assert (
            await _outcome(_drain(stub.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=token))))
            in REFUSED
        )
    # Where a leak would land: the writable places, /etc, and every process's environment.
    script = 'cat /proc/[0-9]*/environ; echo; echo FILES; grep -rsl -e "$1" /workspace /tmp /run /etc /dev/shm; echo E'
    code, out, _ = await gw_exec(gw, "victim", ["/bin/sh", "-c", script, "sh", token])
    assert out.rstrip().endswith("E"), code
    assert token not in out
    assert out.rpartition("FILES")[2].strip() == "E", f"files holding the token: {out}"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert logged, "nothing was logged: the check would be empty"
    assert token not in logged
    assert token not in caplog.text
    for pid in _descendants(os.getpid()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        assert token.encode() not in environ, pid
