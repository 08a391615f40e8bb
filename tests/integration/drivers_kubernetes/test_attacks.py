"""A workload attacking its own supervisor's identity on kubesim with the gateway's address and
its pod's projected ServiceAccount token — which the workload's container does not have (it is
mounted into the supervisor's only, `test_workload_container.py`): these tests copy it from the
node, as a thief who got it elsewhere would hand it in. Each attempt runs inside the sandbox,
through exec, and is refused or rate-limited; the real supervisor keeps its session and returns
the real output. A sandbox JWT cannot be had from inside either; the tests that use one mint it."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from tests.helpers.gateway import RunningGateway, running_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.drivers.kubernetes import rendering
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.events import Progress

from .conftest import gateway_settings
from .test_restarts import pod_with_uid, reactivated_after, session, supervisor_pid

LOOPS = 60
REFUSAL_DELAY = 0.01

# Run inside the pod as the workload: read the pod's token, register with it again and again,
# and try the public API with it; print what came back.
ATTACK = r"""
import asyncio, collections, json, sys
import grpc
from warmshell.api.v1 import sandbox_pb2 as pb, sandbox_pb2_grpc, supervisor_pb2 as spb, supervisor_pb2_grpc

async def main(address, token_path, loops):
    token = open(token_path).read().strip()
    outcomes, leaked = collections.Counter(), []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
        request = spb.RegisterSupervisorRequest(bootstrap_credential=token)
        for _ in range(loops):
            try:
                async for activation in stub.RegisterSupervisor(request):
                    outcomes["ACTIVATED"] += 1
                    leaked.append(dict(activation.workload.environment))
                    break
            except grpc.aio.AioRpcError as exc:
                outcomes[exc.code().name] += 1
        public = sandbox_pb2_grpc.SandboxServiceStub(channel)
        try:
            await public.ListSandboxes(pb.ListSandboxesRequest(), metadata=(("authorization", f"Bearer {token}"),))
            outcomes["PUBLIC_OK"] += 1
        except grpc.aio.AioRpcError as exc:
            outcomes["PUBLIC_" + exc.code().name] += 1
    print(json.dumps({"outcomes": outcomes, "leaked": leaked}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def registered_lines(gw: RunningGateway) -> list[str]:
    """Spy on the gateway's event bus: every "Registered" progress line published from now on."""
    seen: list[str] = []
    bus = gw.gateway.parts.bus
    publish = bus.publish

    def spy(sandbox_id: str, item: object) -> None:
        if isinstance(item, Progress) and item.reason == "Registered":
            seen.append(sandbox_id)
        publish(sandbox_id, item)  # type: ignore[arg-type]

    bus.publish = spy  # type: ignore[method-assign,assignment]
    return seen


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:
    """The suite's gateway, answering refused calls quickly (the default 1 s delay would make a
    loop of 60 take a minute)."""
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state) | {"rate_limits.refusal_delay_seconds": REFUSAL_DELAY}
    async with running_gateway(state, **settings) as running:
        yield running


@pytest.fixture
async def victim(gw: RunningGateway) -> AsyncIterator[pb.Sandbox]:
    await gw.create(name="victim", spec=pb.SandboxSpec(environment={"API_KEY": "s3cr3t"}))
    ready = await gw.wait_ready("victim", timeout=30)
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    return ready


async def test_the_workload_replaying_its_pods_token_gets_nothing(
    gw: RunningGateway, cluster: RunningCluster, victim: pb.Sandbox
) -> None:
    limit = gw.gateway.config.rate_limits.registration
    address = gw.gateway.config.kubernetes.gateway_address
    registered = registered_lines(gw)
    stolen = "/workspace/stolen-token"
    assert await gw.exec("victim", ["sh", "-c", f"cat > {stolen}"], stdin=pod_token(cluster, victim).encode()) == (
        0,
        b"",
        b"",
    )
    code, out, err = await gw.exec("victim", [sys.executable, "-c", ATTACK, address, stolen, str(LOOPS)])
    assert code == 0, err
    found = json.loads(out)
    outcomes = found["outcomes"]
    assert found["leaked"] == [], "a replayed token was activated and got the workload env"
    assert "ACTIVATED" not in outcomes
    # While the real supervisor's session is live, a registration is refused outright, and a
    # loop of them is cut off by the token bucket (the pod's own registration used one token).
    assert 0 < outcomes.get("ALREADY_EXISTS", 0) <= limit.burst
    assert outcomes.get("RESOURCE_EXHAUSTED", 0) >= LOOPS - limit.burst
    assert sum(v for k, v in outcomes.items() if not k.startswith("PUBLIC_")) == LOOPS
    # The socket the pod reaches serves no public API, whatever token is presented.
    assert outcomes.get("PUBLIC_UNIMPLEMENTED") == 1
    assert registered == [], "refused registrations have no driver effect"
    # The sandbox is untouched: same instance, live session, the real output with its env.
    after = await gw.get("victim")
    assert after.status.instance_id == victim.status.instance_id
    assert after.status.phase == pb.SANDBOX_PHASE_READY
    assert await gw.exec("victim", ["sh", "-c", "echo REAL $API_KEY"]) == (0, b"REAL s3cr3t\n", b"")


async def test_the_pods_token_on_the_public_api_is_refused_without_side_effects(
    gw: RunningGateway, cluster: RunningCluster, victim: pb.Sandbox
) -> None:
    """Presented on another RPC, a valid bootstrap credential is authenticated (pure) and refused."""
    token = pod_token(cluster, victim)
    registered = registered_lines(gw)
    as_pod = (("authorization", f"Bearer {token}"),)
    for _ in range(3):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.stub.GetSandbox(pb.SandboxRef(name="victim"), metadata=as_pod)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "may only register supervisors" in (caught.value.details() or "")
        refresh = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel).RefreshSandboxToken(
            spb.RefreshSandboxTokenRequest(), metadata=as_pod
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await refresh
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert registered == []
    assert await gw.exec("victim", ["echo", "REAL"]) == (0, b"REAL\n", b"")


async def test_a_stolen_sandbox_token_cannot_open_a_second_session(gw: RunningGateway, victim: pb.Sandbox) -> None:
    token, _ = gw.gateway.parts.issuer.mint(victim.id, victim.status.instance_id)
    metadata = (("authorization", f"Bearer {token}"),)
    supervisor_socket = gw.gateway.paths.supervisor_socket
    async with grpc.aio.insecure_channel(f"unix://{supervisor_socket}") as channel:
        stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
        for instance_id, refused_with in (
            (victim.status.instance_id, grpc.StatusCode.ALREADY_EXISTS),  # a perfect copy: the session is live
            ("another-pod-uid", grpc.StatusCode.PERMISSION_DENIED),  # a hello that does not match the token
        ):

            async def hello(instance: str = instance_id) -> AsyncIterator[spb.SupervisorMessage]:
                yield spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id=victim.id, instance_id=instance))

            call = stub.ConnectSupervisor(hello(), metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() == refused_with
    code, out, _ = await gw.exec("victim", ["sh", "-c", "echo REAL $API_KEY"])
    assert (code, out) == (0, b"REAL s3cr3t\n")


@pytest.mark.parametrize("activation_write", ["kept", "lost"])
async def test_stalling_the_supervisor_then_replaying_the_token_is_refused(
    cluster: RunningCluster,
    admin: kc.KubeClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    activation_write: str,
) -> None:
    """The supervisor is stalled (SIGSTOP, from the node: the workload cannot see it), the gateway
    drops the silent session, then someone registers with the pod's token: that incarnation of
    the supervisor has already connected, so it is not activated again (only a restarted
    container would be). The stalled supervisor resumes, reconnects with its own token and
    answers with the real output. `lost`: the activation's record change never reaches the
    store (a gateway that crashed before the session's write carried it): the incarnation the
    session recorded comes from its token, and the replay is refused all the same."""
    if activation_write == "lost":

        async def lost(*_: object, **__: object) -> None:
            return None

        monkeypatch.setattr(GatewayActivator, "_record", lost)
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state) | {
        "heartbeat_interval_seconds": 0.2,
        "rate_limits.refusal_delay_seconds": REFUSAL_DELAY,
    }
    async with running_gateway(state, **settings) as gw:
        await gw.create(name="victim", spec=pb.SandboxSpec(environment={"API_KEY": "s3cr3t"}))
        before = await gw.wait_ready("victim", timeout=30)
        token = pod_token(cluster, before)
        pid = supervisor_pid(cluster, await pod_with_uid(admin, before.status.instance_id))
        os.kill(pid, signal.SIGSTOP)
        try:
            await gw.wait_for("victim", lambda s: session(s).status == "False", timeout=10)
            stub = supervisor_pb2_grpc.SupervisorServiceStub(gw.channel)
            call = stub.RegisterSupervisor(spb.RegisterSupervisorRequest(bootstrap_credential=token))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "already activated for incarnation 0" in (caught.value.details() or "")
        finally:
            os.kill(pid, signal.SIGCONT)
        after = await gw.wait_for("victim", reactivated_after(before), timeout=10)
        assert after.status.instance_id == before.status.instance_id
        assert await gw.exec("victim", ["sh", "-c", "echo REAL $API_KEY"]) == (0, b"REAL s3cr3t\n", b"")
        assert supervisor_pid(cluster, await pod_with_uid(admin, before.status.instance_id)) == pid


def pod_token(cluster: RunningCluster, sandbox: pb.Sandbox) -> str:
    """The victim pod's projected token, as another process on its node could read it."""
    assert cluster.pod_root is not None
    (pod_dir,) = [p for p in cluster.pod_root.iterdir() if p.name.endswith("_" + sandbox.status.instance_id[:8])]
    return (pod_dir / rendering.TOKEN_PATH.lstrip("/")).read_text().strip()
