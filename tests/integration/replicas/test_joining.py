"""A replica that the others could not forward to is refused at start while others are alive, and
a forward that cannot reach the session's replica says so, naming the address it tried (real
gateway processes on one Postgres and kubesim)."""

from __future__ import annotations

import grpc
import pytest

from tests.helpers.replicas import ReplicaSet, wait_phase
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.gateway.tokens import load_or_create_api_token

from .scenario import exec_via, owner_of

pytestmark = pytest.mark.timeout(180)

NOWHERE = "127.0.0.1:1"  # an address where nothing listens: connections are refused at once


async def test_a_replica_with_its_own_token_is_refused_and_an_unreachable_owner_is_named(replicas: ReplicaSet) -> None:
    # Alone, a replica whose advertised address reaches nothing starts (nobody forwards to it yet).
    lost = await replicas.start_one(address=NOWHERE)
    md = replicas.metadata
    spec = pb.SandboxSpec(command=["sleep", "600"])
    await replicas.stub(lost.tcp).CreateSandbox(pb.CreateSandboxRequest(name="one", spec=spec), metadata=md)
    assert owner_of(await wait_phase(replicas.stub(lost.tcp), md, "one")) == lost.id

    # A replica with a replica token of its own could never forward to it, nor it to them: refused.
    other_token = replicas.root / "other-replica-token"
    load_or_create_api_token(other_token)
    with pytest.raises(AssertionError, match="did not start") as refused:
        await replicas.start_one(token_file=str(other_token))
    assert f"cannot serve beside the live replicas {lost.id}" in str(refused.value)
    assert f"its replica token is not that of {lost.id}" in str(refused.value)

    # A well-configured replica joins; a call it must forward to the unreachable owner says why.
    joined = await replicas.start_one()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await exec_via(replicas.stub(joined.tcp), md, "one", ["true"])
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    details = failed.value.details() or ""
    assert f"gateway replica {lost.id}, which holds this sandbox's session, is not reachable at {NOWHERE}" in details
    # The owner itself still serves it.
    assert await exec_via(replicas.stub(lost.tcp), md, "one", ["echo", "here"]) == (0, b"here\n")
