"""The supervisor API: RegisterSupervisor (bootstrap -> activation), ConnectSupervisor (the live
session: heartbeats, exec relay, workload output and exit) and RefreshSandboxToken."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.api.v1 import supervisor_pb2_grpc
from warmshell.core import pausing
from warmshell.core.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    WarmshellError,
)
from warmshell.core.ids import SandboxId
from warmshell.core.models import Phase, SandboxRecord, now_ms
from warmshell.drivers.base import Bound, IdentityProvider, SupervisorIdentity
from warmshell.gateway import metrics
from warmshell.gateway.activation import GatewayActivator, reactivation_refused
from warmshell.gateway.auth import Authenticator, Unauthenticated
from warmshell.gateway.calls import held, refuse_stream, streaming, unary
from warmshell.gateway.context import CallContext
from warmshell.gateway.egress import credentials
from warmshell.gateway.manager import SandboxManager
from warmshell.gateway.ratelimits import RateLimiter
from warmshell.gateway.registry import Registry, Replaced
from warmshell.gateway.replicas import ReplicaDirectory
from warmshell.gateway.sessions import MISSED_HEARTBEATS, SupervisorSession
from warmshell.gateway.tokens import SandboxClaims, SandboxTokenIssuer

__all__ = ["SupervisorService"]

log = logging.getLogger(__name__)

# Phases after which a sandbox runs no supervisor that could need a new token (EXITED and ERROR
# are sticky).
_ENDED = (Phase.EXITED, Phase.ERROR, Phase.DELETING)

# A grpc.aio.ServicerContext, or the in-process one of a host-side supervisor's call.
Ctx = CallContext


def _peer(context: Ctx) -> str:
    """gRPC's name of the other end ("ipv4:10.1.2.3:5678"); "" where there is none (in process)."""
    peer = getattr(context, "peer", None)
    return str(peer()) if callable(peer) else ""


class SupervisorService(supervisor_pb2_grpc.SupervisorServiceServicer):
    """Handlers for the first process of every sandbox, called over the sockets and in process
    (`inprocess`). The generated base types each context as grpc's sync and aio contexts in one
    (its `abort` is the sync one), so the handlers, which need only what both grpc.aio's context
    and the in-process one have (`CallContext`), override it with `type: ignore[override]`."""

    def __init__(
        self,
        *,
        manager: SandboxManager,
        identity: IdentityProvider,
        registry: Registry[spb.SupervisorActivationMessage],
        activator: GatewayActivator,
        issuer: SandboxTokenIssuer,
        auth: Authenticator,
        heartbeat_interval_seconds: float,
        registrations: RateLimiter,
        token_refreshes: RateLimiter,
        replicas: ReplicaDirectory | None = None,
        adopt: Callable[[SupervisorSession, spb.SupervisorHello], None] = lambda *_: None,
    ) -> None:
        """`adopt`: told of each new session and its hello (the background commands its
        supervisor keeps are followed from there)."""
        self._manager = manager
        self._identity = identity
        self._registry = registry
        self._activator = activator
        self._issuer = issuer
        self._auth = auth
        self._heartbeat = heartbeat_interval_seconds
        self._registrations = registrations
        self._token_refreshes = token_refreshes
        self._replicas = replicas  # the other gateway replicas on this store, if any
        self._adopt = adopt

    @streaming
    async def RegisterSupervisor(  # type: ignore[override]
        self, request: spb.RegisterSupervisorRequest, context: Ctx
    ) -> AsyncIterator[spb.SupervisorActivationMessage]:
        async for activation in self._registration(request, context):
            yield activation

    async def _registration(
        self, request: spb.RegisterSupervisorRequest, context: Ctx
    ) -> AsyncIterator[spb.SupervisorActivationMessage]:
        """RegisterSupervisor's work, its refusals raised (OpenSupervisor's are sent once its
        caller's messages have been read, `refuse_stream`)."""
        # Limited before authenticating too: a looped stolen credential costs a hash, not a
        # TokenReview and the cluster reads behind it.
        digest = hashlib.sha256(request.bootstrap_credential.encode()).hexdigest()
        await _admit(self._registrations, f"credential/{digest}", "registrations with this credential")
        identity = await self._identity.authenticate(request.bootstrap_credential)
        if identity is None:
            raise Unauthenticated("unknown bootstrap credential")
        await _admit(
            self._registrations, f"instance/{identity.instance_id}", f"registrations of instance {identity.instance_id}"
        )
        if isinstance(identity.binding, Bound):
            await self._refuse_reactivation(identity, identity.binding.sandbox_id)
        registration = self._registry.register(identity, peer=credentials.source_address(_peer(context)))
        metrics.REGISTRATIONS_PENDING.set(self._registry.pending_count())
        # The one place a registration's driver effects happen (authentication itself is pure).
        self._identity.registered(identity)
        try:
            if isinstance(identity.binding, Bound):
                # Cold instances take the same path as warm ones, just without waiting for a claim.
                # A warm driver's claim controller may have activated this very registration first
                # (register() cleared any older tombstone, so one now is this stream's own outcome).
                with contextlib.suppress(AlreadyExistsError):
                    await self._activator.activate(
                        instance_id=identity.instance_id,
                        sandbox_id=identity.binding.sandbox_id,
                        proof=identity.binding.proof,
                        reason="bound at create",
                    )
            outcome = await registration.next_outcome()
            if isinstance(outcome, Replaced):
                await context.abort(grpc.StatusCode.ABORTED, outcome.reason)
            if isinstance(outcome, WarmshellError):
                raise outcome
            yield outcome
        finally:
            self._registry.remove_if_session(identity.instance_id, registration.session_id)
            metrics.REGISTRATIONS_PENDING.set(self._registry.pending_count())

    async def ConnectSupervisor(  # type: ignore[override]
        self, request_iterator: AsyncIterator[spb.SupervisorMessage], context: Ctx
    ) -> AsyncIterator[spb.GatewayMessage]:
        request_iterator = held(context, request_iterator)
        try:
            claims = await self._auth.require_sandbox(context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await refuse_stream(context, request_iterator, exc, "ConnectSupervisor")
        async for message in self._session(claims, request_iterator, context, "ConnectSupervisor"):
            yield message

    async def OpenSupervisor(  # type: ignore[override]
        self, request_iterator: AsyncIterator[spb.SupervisorMessage], context: Ctx
    ) -> AsyncIterator[spb.GatewayMessage]:
        # The registration's checks are RegisterSupervisor's own (this runs it); the session's
        # are ConnectSupervisor's, with the claims of the token just minted for this very
        # registration standing in for the bearer token a reconnect presents.
        request_iterator = held(context, request_iterator)
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None or not first.HasField("register"):
                raise InvalidArgumentError("message", "the first message of OpenSupervisor must be register")
            activation = None
            async for outcome in self._registration(first.register, context):
                activation = outcome
            if activation is None:  # RegisterSupervisor ends with an activation or a status
                raise FailedPreconditionError("the registration ended without an activation")
            claims = self._issuer.verify(activation.token)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await refuse_stream(context, request_iterator, exc, "OpenSupervisor")
        activated = spb.GatewayMessage(activation=activation)
        # Not kept for the session's lifetime: the pod's credential, the activation's secrets.
        del first, activation
        yield activated
        del activated
        async for reply in self._session(claims, request_iterator, context, "OpenSupervisor"):
            yield reply

    async def _session(
        self, claims: SandboxClaims, request_iterator: AsyncIterator[spb.SupervisorMessage], context: Ctx, call: str
    ) -> AsyncIterator[spb.GatewayMessage]:
        """A supervisor session for `claims`, from its hello (the next message of
        `request_iterator`) until it ends."""
        try:
            session, hello = await self._accept(claims, request_iterator)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            # A supervisor sends what its outbox holds right after its hello.
            await refuse_stream(context, request_iterator, exc, call)
        metrics.SESSIONS.set(len(self._manager.sessions))
        interval_ms = int(self._heartbeat * 1000)
        session.send(
            spb.GatewayMessage(
                accepted=spb.SessionAccepted(session_id=session.session_id, heartbeat_interval_ms=interval_ms)
            )
        )
        self._adopt(session, hello)
        reader = asyncio.create_task(self._read_session(session, request_iterator))
        ticker = _Heartbeats(session, self._heartbeat)
        try:
            # Inside the try: a supervisor that goes away, or a store that cannot record the session
            # (unreachable), must close it and stop the reader and the ticker, not leave them behind.
            # Also remembers that the activated incarnation has opened a session (see
            # `_refuse_reactivation`), in the same write.
            await self._manager.on_session(
                claims.sandbox_id, connected=True, session_id=session.session_id, incarnation=claims.incarnation
            )
            while True:
                message = await session.outbox.get()
                if message is None:
                    return
                yield message
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            # e.g. UNAVAILABLE: the supervisor retries. It is still sending (its outbox), so the
            # reader stops and the rest is drained before the status (`refuse_stream`); the
            # session is closed first, so no exec waits on it meanwhile.
            session.close()
            ticker.cancel()
            await _stopped(reader)
            await refuse_stream(context, request_iterator, exc, call)
        finally:
            ticker.cancel()
            await _stopped(reader)
            if self._manager.sessions.close_if_current(session):
                try:
                    await self._manager.on_session(claims.sandbox_id, connected=False, session_id=session.session_id)
                except WarmshellError as exc:
                    # The session is gone either way; its reconnect (or the backend) corrects the record.
                    log.warning("sandbox %s: could not record its closed session: %s", claims.sandbox_id, exc)
            metrics.SESSIONS.set(len(self._manager.sessions))

    async def _accept(
        self, claims: SandboxClaims, messages: AsyncIterator[spb.SupervisorMessage]
    ) -> tuple[SupervisorSession, spb.SupervisorHello]:
        """The session a supervisor's hello opens, and the hello, if its token, its hello and the
        sandbox's record agree (and no live replica holds the sandbox's session)."""
        first = await anext(aiter(messages), None)
        if first is None or not first.HasField("hello"):
            raise FailedPreconditionError("the first message of a session must be hello")
        if first.hello.sandbox_id != claims.sandbox_id or first.hello.instance_id != claims.instance_id:
            log.warning(
                "refused supervisor session: hello names sandbox %s instance %s, the token sandbox %s instance %s",
                first.hello.sandbox_id,
                first.hello.instance_id,
                claims.sandbox_id,
                claims.instance_id,
            )
            raise PermissionDeniedError("hello names another sandbox or instance than the token")
        record = await self._manager.records.get(claims.sandbox_id)
        if record is None or record.status.phase == Phase.DELETING:
            raise NotFoundError(f"sandbox {claims.sandbox_id} no longer exists")
        if record.status.phase == Phase.PAUSED or pausing.is_retired(record.status, claims.instance_id):
            # A token minted before a pause is void, however long it has left: the resumed
            # sandbox runs a new instance with a token of its own.
            raise PermissionDeniedError(f"instance {claims.instance_id} no longer runs sandbox {claims.sandbox_id}")
        await self._refuse_if_live_elsewhere(record)
        return self._open_session(claims), first.hello

    async def _refuse_reactivation(self, identity: SupervisorIdentity, sandbox_id: SandboxId) -> None:
        """A bound sandbox is activated again only for a supervisor that could be a new one: its
        session is not live, and no session has been opened by this incarnation of it yet.

        On Kubernetes the pod's token is readable by its workload, so a re-registration must not
        hand a second copy of the activation (the sandbox token, the request's env) to whoever
        holds it while the real supervisor lives, or merely stalls (SIGSTOP: it reconnects with
        its own token). A restarted container is a later incarnation, and a supervisor whose
        activation was lost before it connected has opened no session; both are activated."""
        live = self._manager.sessions.live(sandbox_id) is not None
        record = None if live else await self._manager.records.get(sandbox_id)
        why = reactivation_refused(identity, record.status if record is not None else None, session_live=live)
        if why:
            log.warning("refused registration of instance %s: sandbox %s %s", identity.instance_id, sandbox_id, why)
            # Retryable for the supervisor: a restarted one may register before its restart is
            # visible in the pod's status, or before its old session is seen gone.
            raise AlreadyExistsError(f"sandbox {sandbox_id} {why}")

    async def _refuse_if_live_elsewhere(self, record: SandboxRecord) -> None:
        """With replicas: a session another live replica holds is not superseded from here (a
        copied sandbox token must not pull the sandbox's execs away from its supervisor). A
        supervisor whose replica just died is waiting here too: it is accepted as soon as that
        replica is presumed dead (within three replica heartbeats), instead of being sent away
        to retry later."""
        owner = record.status.session_owner
        if self._replicas is None or not record.status.supervisor_connected:
            return
        if owner in ("", self._replicas.replica_id) or await self._replicas.wait_presumed_dead(owner):
            return
        log.warning("refused a supervisor session for sandbox %s: replica %s holds a live one", record.id, owner)
        raise AlreadyExistsError(f"sandbox {record.id} has a live supervisor session on gateway replica {owner}")

    def _open_session(self, claims: SandboxClaims) -> SupervisorSession:
        try:
            return self._manager.sessions.open(claims.sandbox_id, claims.instance_id)
        except AlreadyExistsError:
            log.warning(
                "refused a second supervisor session for sandbox %s (instance %s): its session is live",
                claims.sandbox_id,
                claims.instance_id,
            )
            raise

    async def _read_session(self, session: SupervisorSession, messages: AsyncIterator[spb.SupervisorMessage]) -> None:
        sandbox_id = SandboxId(session.sandbox_id)
        try:
            async for message in messages:
                session.last_seen = now_ms()
                kind = message.WhichOneof("message")
                if kind == "output":
                    if message.output.exec_id:
                        session.deliver(message.output)
                    else:
                        self._manager.on_output(sandbox_id, stderr=message.output.stderr, data=message.output.data)
                elif kind == "exec_exited":
                    session.deliver(message.exec_exited)
                elif kind == "exec_input_credit":
                    session.deliver(message.exec_input_credit)
                elif kind == "file_result":
                    if (results := session.file_ops.get(message.file_result.op_id)) is not None:
                        results.put_nowait(message.file_result)
                elif kind == "workload_exited":
                    await self._manager.on_workload_exit(sandbox_id, message.workload_exited.exit_code)
                    # Terminal: the supervisor may exit now that the gateway has the exit code.
                    session.close("workload exited")
                    return
        finally:
            session.close()

    @unary
    async def RefreshSandboxToken(  # type: ignore[override]
        self, request: spb.RefreshSandboxTokenRequest, context: Ctx
    ) -> spb.RefreshSandboxTokenResponse:
        claims = await self._auth.require_sandbox(context)
        await _admit(self._token_refreshes, claims.instance_id, f"token refreshes of instance {claims.instance_id}")
        record = await self._manager.records.get(claims.sandbox_id)
        if record is None or record.status.phase in _ENDED:
            raise NotFoundError(f"sandbox {claims.sandbox_id} no longer exists or has ended")
        if record.status.instance_id != claims.instance_id or pausing.is_retired(record.status, claims.instance_id):
            # A validly signed token of an instance the sandbox is not running (a former or made-up
            # one) must not be renewable: it would outlive the instance it was minted for.
            raise PermissionDeniedError(f"instance {claims.instance_id} is not the running instance of its sandbox")
        token, expires = self._issuer.mint(claims.sandbox_id, claims.instance_id, claims.incarnation)
        return spb.RefreshSandboxTokenResponse(token=token, expires_at_ms=expires)


async def _stopped(task: asyncio.Task[None]) -> None:
    """`task` cancelled and ended (what it raised is the session's end, already handled)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.gather(task, return_exceptions=True)


class _Heartbeats:
    """A session's heartbeats: every interval, one to the supervisor, or the session closed when
    the supervisor has been silent for `MISSED_HEARTBEATS` intervals. A timer, not a sleeping
    task per session: nothing runs between beats, and opening a session makes no task for it."""

    def __init__(self, session: SupervisorSession, interval_seconds: float) -> None:
        self._session = session
        self._interval = interval_seconds
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(interval_seconds, self._beat)

    def _beat(self) -> None:
        session = self._session
        if session.closed.is_set():
            return
        if now_ms() - session.last_seen > MISSED_HEARTBEATS * self._interval * 1000:
            log.warning("supervisor session of sandbox %s missed its heartbeats; closing", session.sandbox_id)
            # Silent, not gone: a supervisor that is alive after all reconnects and is checked
            # again; one that is dead is reported by its backend.
            session.close("heartbeat timeout", reconnect=True)
            return
        session.send(spb.GatewayMessage(heartbeat=spb.Heartbeat(sent_at_ms=now_ms())))
        self._timer = self._loop.call_later(self._interval, self._beat)

    def cancel(self) -> None:
        """No more beats."""
        self._timer.cancel()


async def _admit(limiter: RateLimiter, key: str, what: str) -> None:
    """Count one call under `key`; RESOURCE_EXHAUSTED (and the metric) when over the limit,
    after the limiter's refusal delay."""
    refused = limiter.refusals(key)
    if not refused:
        return
    metrics.RATE_LIMITED.labels(call=limiter.name).inc()
    if refused == 1:  # once per run of refusals: a loop must not flood the log either
        log.warning("rate limited: too many %s", what)
    await asyncio.sleep(limiter.refusal_delay_seconds)
    limit = limiter.limit
    raise ResourceExhaustedError(
        f"too many {what}: at most {limit.burst} at once, then {limit.per_second:g}/s; retry later"
    )
