"""OpenSupervisor: a warm supervisor's registration stream brings its activation and then becomes
its session (no second call between the activation and Ready); a reconnect afterwards opens
ConnectSupervisor with the activation's token as before. A whole gateway on real sockets with
the fake driver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from tests.helpers.opening import fake_gateway, hello, register, until
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.ids import SandboxId


async def test_the_registration_stream_becomes_the_session() -> None:
    async with fake_gateway() as gw:
        credential = gw.driver.add_warm_instance()
        instance = credential.split(".")[1]
        call, driven = gw.open(register(credential))
        try:
            await until(lambda: gw.gateway.parts.registry.pending_count() == 1)
            created = await gw.create("warm")
            async with asyncio.timeout(10):
                first = await call.read()
            assert first.WhichOneof("message") == "activation"
            assert first.activation.sandbox_id == created.id
            assert first.activation.token
            driven.send(hello(created.id, instance))
            async with asyncio.timeout(10):
                accepted = await call.read()
            assert accepted.WhichOneof("message") == "accepted"
            sessions = gw.gateway.parts.manager.sessions
            assert sessions.live(SandboxId(created.id)) is not None
            ready = await gw.get("warm")
            assert ready.status.phase == pb.SANDBOX_PHASE_READY
            assert ready.status.instance_id == instance
            assert ready.status.allocation == "warm"
            assert gw.driver.identity.registrations == [instance], "one registration, on the one stream"
        finally:
            driven.end()
            call.cancel()
        # The stream is gone: the supervisor reconnects with its token, as after any lost session.
        await until(lambda: gw.gateway.parts.manager.sessions.live(SandboxId(created.id)) is None)

        async def reconnecting() -> AsyncIterator[spb.SupervisorMessage]:
            yield hello(created.id, instance)
            await asyncio.Event().wait()  # the session stays open until cancelled

        bearer = (("authorization", f"Bearer {first.activation.token}"),)
        again = gw.supervisors.ConnectSupervisor(reconnecting(), metadata=bearer)
        try:
            async with asyncio.timeout(10):
                assert (await again.read()).WhichOneof("message") == "accepted"
            assert (await gw.get("warm")).status.phase == pb.SANDBOX_PHASE_READY
        finally:
            again.cancel()


async def test_a_registration_refused_on_the_stream_ends_it_with_registers_status() -> None:
    async with fake_gateway() as gw:
        call, driven = gw.open(register("not-a-credential-of-this-driver"))
        try:
            async with asyncio.timeout(10):
                code = await call.code()
        finally:
            driven.end()  # a failed call does not stop reading its requests by itself
            call.cancel()
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert gw.driver.identity.registrations == []


async def test_a_deleted_sandboxs_supervisor_is_told_to_stop_not_left_to_reconnect() -> None:
    # A stream that merely ended would send the supervisor back with ConnectSupervisor, to be
    # refused: one call per delete for nothing. It is told to stop instead (`Shutdown`, an
    # existing message every supervisor acts on).
    async with fake_gateway() as gw:
        credential = gw.driver.add_warm_instance()
        call, driven = gw.open(register(credential))
        try:
            await until(lambda: gw.gateway.parts.registry.pending_count() == 1)
            created = await gw.create("warm")
            async with asyncio.timeout(10):
                assert (await call.read()).WhichOneof("message") == "activation"
            driven.send(hello(created.id, credential.split(".")[1]))
            async with asyncio.timeout(10):
                assert (await call.read()).WhichOneof("message") == "accepted"
            await gw.sandboxes.DeleteSandbox(pb.SandboxRef(name="warm"), metadata=gw._metadata())
            async with asyncio.timeout(10):
                told = await call.read()
                while told.WhichOneof("message") == "heartbeat":
                    told = await call.read()
                assert told.WhichOneof("message") == "shutdown"
                assert not told.shutdown.reconnect
                assert "deleted" in told.shutdown.reason
                assert await call.read() == grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
        finally:
            driven.end()
            call.cancel()
