"""Two replicas on kubesim: whatever replica a call reaches, it is served; calls that need the
supervisor's session are forwarded to the replica holding it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from kubesim.controllers import client as kc
from tests.helpers.replicas import ReplicaSet, wait_phase
from tests.integration.drivers_kubernetes.conftest import NAMESPACE
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.core.ids import SandboxId
from warmshell.gateway.tokens import SandboxTokenIssuer, load_or_create_signing_key

from .scenario import exec_via, owner_of

pytestmark = pytest.mark.timeout(180)


async def test_exec_and_output_reach_the_session_through_any_replica(
    replicas: ReplicaSet, admin: kc.KubeClient
) -> None:
    first, second = await replicas.start_one(), await replicas.start_one()
    stubs = {r.id: replicas.stub(r.tcp) for r in (first, second)}
    md = replicas.metadata
    await stubs[first.id].CreateSandbox(
        pb.CreateSandboxRequest(name="one", spec=pb.SandboxSpec(command=["sh", "-c", "echo started; sleep 600"])),
        metadata=md,
    )
    # Watched on the other replica: it hears the writes of whichever replica activates it.
    ready = await wait_phase(stubs[second.id], md, "one")
    owner = owner_of(ready)
    assert owner in stubs
    other = next(r for r in stubs if r != owner)
    for via in (owner, other):
        assert await exec_via(stubs[via], md, "one", ["echo", "hi", via]) == (0, f"hi {via}\n".encode())
    # A large output streams through the forwarding replica intact (8 MiB > one exec window).
    code, out = await exec_via(stubs[other], md, "one", ["sh", "-c", "head -c 8388608 /dev/zero"])
    assert (code, len(out)) == (0, 8 * 1024 * 1024)
    # Workload output is where the session is; a watch with output on the other replica gets it.
    request = pb.WatchSandboxRequest(name="one", follow_output=True)
    seen = b""
    async for event in stubs[other].WatchSandbox(request, metadata=md):
        if event.HasField("output"):
            seen += event.output.data
            if b"started" in seen:
                break
    assert b"started\n" in seen
    # The owner's status comes back unchanged through the forwarding replica.
    code, out = await exec_via(stubs[other], md, "one", ["sh", "-c", "exit 7"])
    assert code == 7

    # An exec with streamed stdin is forwarded as a stream both ways: every chunk reaches the
    # command on the owner, and its answer comes back.
    async def stdin() -> AsyncIterator[pb.ExecStreamRequest]:
        start = pb.ExecStreamStart(exec=pb.ExecSandboxRequest(name="one", command=["wc", "-c"]))
        yield pb.ExecStreamRequest(start=start)
        for _ in range(3):
            yield pb.ExecStreamRequest(stdin=b"x" * 100_000)
        yield pb.ExecStreamRequest(close_stdin=True)

    streamed, streamed_code = b"", None
    async for event in stubs[other].ExecSandboxStream(stdin(), metadata=md):
        streamed += event.stdout
        if event.HasField("exit_code"):
            streamed_code = event.exit_code
    assert (streamed_code, streamed.strip()) == (0, b"300000")
    # Deleting through the replica that does not hold the session works too.
    await stubs[other].DeleteSandbox(pb.SandboxRef(name="one"), metadata=md)
    assert (await admin.list_objects(kc.SANDBOXES, NAMESPACE))["items"] == []


async def test_a_call_with_a_wrong_replica_token_is_refused(replicas: ReplicaSet) -> None:
    replica = await replicas.start_one()
    stub = replicas.stub(replica.tcp)
    bad = (("authorization", "Bearer not-the-replica-token"), ("x-warmshell-forwarded-by", "gw-9"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=bad)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_copied_sandbox_token_cannot_pull_a_live_session_to_another_replica(replicas: ReplicaSet) -> None:
    """Whoever holds the sandbox's token (the workload can read it on Kubernetes) connects to the
    replica that does not hold the session: refused while the real session is live there."""
    first, second = await replicas.start_one(), await replicas.start_one()
    stubs = {r.id: replicas.stub(r.tcp) for r in (first, second)}
    md = replicas.metadata
    await stubs[first.id].CreateSandbox(pb.CreateSandboxRequest(name="held"), metadata=md)
    ready = await wait_phase(stubs[first.id], md, "held")
    owner = owner_of(ready)
    other = next(r for r in (first, second) if r.id != owner)
    key = load_or_create_signing_key(replicas.shared / "signing-key.pem")
    issuer = SandboxTokenIssuer(key, gateway_id="replicas-test", ttl_seconds=600)
    token, _ = issuer.mint(SandboxId(ready.id), ready.status.instance_id)
    channel = grpc.aio.insecure_channel(other.tcp)
    replicas.channels.append(channel)
    hello = spb.SupervisorMessage(
        hello=spb.SupervisorHello(sandbox_id=ready.id, instance_id=ready.status.instance_id, workload_started=True)
    )

    async def messages() -> AsyncIterator[spb.SupervisorMessage]:
        yield hello

    call = supervisor_pb2_grpc.SupervisorServiceStub(channel).ConnectSupervisor(
        messages(), metadata=(("authorization", f"Bearer {token}"),)
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert owner in (caught.value.details() or "")
    assert owner_of(await stubs[other.id].GetSandbox(pb.SandboxRef(name="held"), metadata=md)) == owner
    assert await exec_via(stubs[other.id], md, "held", ["echo", "still"]) == (0, b"still\n")


async def test_a_watch_on_any_replica_sees_every_progress_line(replicas: ReplicaSet) -> None:
    """ "Created" is said by the replica that made the create and "Registered" by the one the pod's
    supervisor reached: a watch on either replica sees both, each once."""
    first, second = await replicas.start_one(), await replicas.start_one()
    stubs = [replicas.stub(r.tcp) for r in (first, second)]
    md = replicas.metadata
    await stubs[0].CreateSandbox(
        pb.CreateSandboxRequest(name="told", spec=pb.SandboxSpec(command=["sleep", "600"])), metadata=md
    )
    for stub in stubs:
        reasons = await progress_reasons(stub, md, "told", until={"Created", "Registered"})
        assert reasons.count("Created") == 1
        assert reasons.count("Registered") == 1
    await stubs[1].DeleteSandbox(pb.SandboxRef(name="told"), metadata=md)


async def progress_reasons(stub: Any, md: Any, name: str, *, until: set[str]) -> list[str]:
    """The progress reasons a watch replays and follows, once all of `until` are among them (a
    watch that ends at Ready before a line arrived is opened again: it replays from the start)."""
    reasons: list[str] = []
    try:
        async with asyncio.timeout(60):
            while True:
                reasons = []
                async for event in stub.WatchSandbox(pb.WatchSandboxRequest(name=name), metadata=md):
                    if event.HasField("progress"):
                        reasons.append(event.progress.reason)
                    if until <= set(reasons):
                        return reasons
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{name}: the watch saw {reasons}, not all of {sorted(until)}") from None
