"""Bad input: a gRPC status whose message names the field and the rule; nothing half-created."""

from __future__ import annotations

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import sandbox_pb2 as pb

CASES = [
    ({"name": "Bad_Name"}, grpc.StatusCode.INVALID_ARGUMENT, "name"),
    ({"name": "x" * 41}, grpc.StatusCode.INVALID_ARGUMENT, "at most 40"),
    ({"workspace": "team/a"}, grpc.StatusCode.INVALID_ARGUMENT, "workspace"),
    ({"spec": pb.SandboxSpec(environment={"1BAD": "v"})}, grpc.StatusCode.INVALID_ARGUMENT, "spec.environment['1BAD']"),
    ({"spec": pb.SandboxSpec(environment={"WARMSHELL_X": "v"})}, grpc.StatusCode.INVALID_ARGUMENT, "reserved"),
    (
        {"spec": pb.SandboxSpec(resources=pb.Resources(cpu="lots"))},
        grpc.StatusCode.INVALID_ARGUMENT,
        "spec.resources.cpu",
    ),
    (
        {"spec": pb.SandboxSpec(resources=pb.Resources(memory="1.5"))},
        grpc.StatusCode.INVALID_ARGUMENT,
        "spec.resources.memory",
    ),
    ({"spec": pb.SandboxSpec(image="/no/such/rootfs")}, grpc.StatusCode.INVALID_ARGUMENT, "spec.image"),
    ({"spec": pb.SandboxSpec(runtime_class_name="gvisor")}, grpc.StatusCode.INVALID_ARGUMENT, "runtime_class_name"),
    ({"labels": {"warmshell.dev/x": "1"}}, grpc.StatusCode.INVALID_ARGUMENT, "labels"),
    ({"spec": pb.SandboxSpec(command=["x"] * 300)}, grpc.StatusCode.INVALID_ARGUMENT, "spec.command"),
]


@pytest.mark.parametrize(("fields", "code", "fragment"), CASES)
async def test_invalid_create(
    gw: RunningGateway, fields: dict[str, object], code: grpc.StatusCode, fragment: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await gw.create(**fields)
    assert err.value.code() == code
    assert fragment in (err.value.details() or "")
    listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=gw.metadata)
    assert list(listed.sandboxes) == []
    assert await gw.gateway.parts.driver.list() == []


async def test_oversized_request(gw: RunningGateway) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await gw.create(spec=pb.SandboxSpec(environment={"BIG": "x" * (2 * 1024 * 1024)}))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_unknown_and_duplicate(gw: RunningGateway) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await gw.get("nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "default/nope" in (err.value.details() or "")
    await gw.create(name="dup")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await gw.create(name="dup")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await gw.stub.ExecSandbox(pb.ExecSandboxRequest(name="dup"), metadata=gw.metadata).read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
