"""Replica-to-replica forwarding: a call that needs a sandbox's supervisor session (exec, a watch
with output, files), arriving on a replica that does not hold the session, is passed to the
replica that does, as the same gRPC method with the same messages.

The owner is the stored record's `session_owner`; its address comes from the replica directory.
The forwarded call carries the replicas' shared token (the owner accepts it as a client, and
never forwards such a call again, so two replicas that disagree about the owner cannot loop).
Streams are relayed message by message: the relaying replica reads the next upstream message only
after its own client took the previous one, so gRPC's flow control carries backpressure end to end
(and the owner's exec credit window stays the only buffer). The forwarder is generic over the four
call shapes, so new session RPCs forward by naming their method.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message

from warmshell.core.errors import UnavailableError
from warmshell.core.models import SandboxRecord
from warmshell.gateway.auth import FORWARDED_BY, Authenticator
from warmshell.gateway.replicas import ReplicaDirectory

__all__ = ["Forwarder", "Target", "relayed_status"]

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
Resp = TypeVar("Resp", bound=Message)
# Forwarded streams may carry as much as the public API accepts (file chunks, exec output). An
# owner that stops answering mid-stream (frozen, its host gone without closing the connection)
# is found by keepalive PINGs, as the SDK's clients find a stopped gateway: otherwise the client,
# whose own PINGs this replica answers, would wait on the relay for ever.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", -1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class Target:
    """Where one call goes: the owner replica's id and address."""

    __slots__ = ("address", "replica_id")

    def __init__(self, replica_id: str, address: str) -> None:
        self.replica_id = replica_id
        self.address = address


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


# What grpc says when no connection to the address could be made (refused, no route, no such
# host): the owner never saw the call, so the error is about reaching it, not its answer.
_CONNECT_FAILED = "failed to connect to all addresses"


def relayed_status(code: grpc.StatusCode, details: str, target: Target) -> tuple[grpc.StatusCode, str]:
    """The status this call ends with when the forwarded one failed: the owner's answer, code and
    message unchanged; or, when the owner could not be reached or refused this replica's
    credential, a message that says so and names it and its address."""
    owner = f"gateway replica {target.replica_id}, which holds this sandbox's session,"
    if code is grpc.StatusCode.UNAVAILABLE and _CONNECT_FAILED in details:
        return code, f"{owner} is not reachable at {target.address} ({details})"
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return code, (
            f"{owner} refused this replica's token at {target.address}: give every replica the same"
            f" [replicas] token_file ({details})"
        )
    return code, details


async def _relay_status(context: Ctx, exc: grpc.aio.AioRpcError, target: Target) -> NoReturn:
    """The forwarded call's failure becomes this call's (see `relayed_status`)."""
    await context.abort(*relayed_status(exc.code(), exc.details() or "", target))
    raise AssertionError("abort returns only by raising")  # pragma: no cover


class Forwarder:
    """Finds a session's owner and relays calls to it over one cached channel per replica."""

    def __init__(self, directory: ReplicaDirectory, auth: Authenticator, *, token: str) -> None:
        self._directory = directory
        self._auth = auth
        self._metadata = (("authorization", f"Bearer {token}"), (FORWARDED_BY, directory.replica_id))
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def target(self, record: SandboxRecord, context: Ctx) -> Target | None:
        """The replica to forward to, or None to serve here (this replica holds the session, the
        sandbox has none, or the call was forwarded already). UnavailableError when the owner is
        presumed dead: its supervisor is reconnecting to a survivor, so a retry soon succeeds."""
        status = record.status
        owner = status.session_owner
        if not status.supervisor_connected or not owner or owner == self._directory.replica_id:
            return None
        if self._auth.is_replica(context):
            return None  # forwarded to us: answer here, never pass it on again
        replica = await self._directory.live_replica(owner)
        where = f"sandbox {record.workspace}/{record.name}: its session is on gateway replica {owner}"
        if replica is None:
            raise UnavailableError(
                f"{where}, which has stopped renewing its place in the store (presumed dead); its supervisor"
                " reconnects to another replica, retry shortly"
            )
        if not replica.address:
            raise UnavailableError(
                f"{where}, which is alive but gave no address the other replicas can reach (its [replicas]"
                " address or listen_tcp)"
            )
        return Target(owner, replica.address)

    async def others(self, context: Ctx) -> list[Target]:
        """Every other live replica that gave an address (none for a call forwarded already)."""
        if self._auth.is_replica(context):
            return []
        alive = await self._directory.live_others_with(lambda _others: [])
        return [Target(r.id, r.address) for r in alive if r.address and r.id in self._directory.alive_ids()]

    async def gather_unary(
        self, targets: list[Target], method: str, request: Message, response: Callable[[bytes], Resp], context: Ctx
    ) -> list[Resp]:
        """The same unary call on each target at once; the answers of those that gave one (a
        replica that fails is left out and logged: what the others know is still an answer)."""

        async def one(target: Target) -> Resp | None:
            call = self._channel(target).unary_unary(
                method, request_serializer=_serialize, response_deserializer=response
            )
            try:
                result: Resp = await call(request, metadata=self._metadata, timeout=self._timeout(context))
            except grpc.aio.AioRpcError as exc:
                log.warning("%s on replica %s failed: %s", method, target.replica_id, exc.details())
                return None
            return result

        answers = await asyncio.gather(*(one(target) for target in targets))
        return [answer for answer in answers if answer is not None]

    def _channel(self, target: Target) -> grpc.aio.Channel:
        channel = self._channels.get(target.address)
        if channel is None:
            channel = self._channels[target.address] = grpc.aio.insecure_channel(
                target.address, options=_CHANNEL_OPTIONS
            )
        return channel

    def _timeout(self, context: Ctx) -> float | None:
        remaining = context.time_remaining()
        return remaining if remaining is not None and remaining < 1e9 else None

    async def unary_unary(
        self, target: Target, method: str, request: Message, response: Callable[[bytes], Resp], context: Ctx
    ) -> Resp:
        """Forward a unary call; the owner's reply (or status) is returned as is."""
        call = self._channel(target).unary_unary(method, request_serializer=_serialize, response_deserializer=response)
        try:
            result: Resp = await call(request, metadata=self._metadata, timeout=self._timeout(context))
        except grpc.aio.AioRpcError as exc:
            await _relay_status(context, exc, target)
        return result

    async def unary_stream(
        self, target: Target, method: str, request: Message, response: Callable[[bytes], Resp], context: Ctx
    ) -> AsyncIterator[Resp]:
        """Forward a server-streaming call, yielding the owner's messages one at a time."""
        stub = self._channel(target).unary_stream(method, request_serializer=_serialize, response_deserializer=response)
        call = stub(request, metadata=self._metadata, timeout=self._timeout(context))
        async for message in self._relay(call, context, target):
            yield message

    async def stream_unary(
        self,
        target: Target,
        method: str,
        requests: AsyncIterator[Message],
        response: Callable[[bytes], Resp],
        context: Ctx,
    ) -> Resp:
        """Forward a client-streaming call (the requests are pulled as the owner takes them)."""
        stub = self._channel(target).stream_unary(method, request_serializer=_serialize, response_deserializer=response)
        call = stub(requests, metadata=self._metadata, timeout=self._timeout(context))
        try:
            result: Resp = await call
        except grpc.aio.AioRpcError as exc:
            await _relay_status(context, exc, target)
        finally:
            call.cancel()  # a no-op once it completed; ends the upstream call if we were cancelled
        return result

    async def stream_stream(
        self,
        target: Target,
        method: str,
        requests: AsyncIterator[Message],
        response: Callable[[bytes], Resp],
        context: Ctx,
    ) -> AsyncIterator[Resp]:
        """Forward a bidirectional call: requests flow up as the owner takes them, replies down
        as this call's client takes them."""
        stub = self._channel(target).stream_stream(
            method, request_serializer=_serialize, response_deserializer=response
        )
        call = stub(requests, metadata=self._metadata, timeout=self._timeout(context))
        async for message in self._relay(call, context, target):
            yield message

    async def _relay(self, call: Any, context: Ctx, target: Target) -> AsyncIterator[Any]:
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            await _relay_status(context, exc, target)
        finally:
            call.cancel()

    async def aclose(self, *, grace: float | None = None) -> None:
        """Close the channels to other replicas; calls still in flight on them get `grace`
        seconds to finish (None: none), all channels' at once."""
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(channel.close(grace=grace) for channel in channels), return_exceptions=True)
