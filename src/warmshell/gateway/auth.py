"""Who is calling: a client with the API token, a sandbox with its JWT, or a supervisor with a
bootstrap credential. Each principal may call only its own RPCs; anything else is refused.

A call another gateway replica forwarded carries the replicas' shared token instead of the API
token: it is a client call (the forwarding replica checked the client) and is never forwarded
again."""

from __future__ import annotations

import hmac
from enum import Enum

import grpc

from warmshell.core.errors import PermissionDeniedError
from warmshell.drivers.base import IdentityProvider
from warmshell.gateway.context import CallContext
from warmshell.gateway.tokens import SandboxClaims, SandboxTokenIssuer

__all__ = ["FORWARDED_BY", "Authenticator", "Principal", "Unauthenticated", "bearer_token", "forwarded_by"]

# Metadata naming the replica that forwarded a call (informational: the token is what counts).
FORWARDED_BY = "x-warmshell-forwarded-by"


class Principal(Enum):
    """Kinds of callers."""

    CLIENT = "client"
    SANDBOX = "sandbox"
    SUPERVISOR_BOOTSTRAP = "supervisor-bootstrap"


class Unauthenticated(Exception):
    """No usable credential (maps to UNAUTHENTICATED)."""


def bearer_token(context: CallContext) -> str:
    """The bearer token from the call's `authorization` metadata ("" when absent)."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def forwarded_by(context: grpc.aio.ServicerContext[object, object]) -> str:
    """The replica a call says forwarded it ("" when none)."""
    for key, value in context.invocation_metadata() or ():
        if key == FORWARDED_BY:
            return value.decode() if isinstance(value, bytes) else value
    return ""


class Authenticator:
    """Classifies bearer tokens and enforces which principal may call what."""

    def __init__(
        self, *, api_token: str, issuer: SandboxTokenIssuer, identity: IdentityProvider, replica_token: str = ""
    ) -> None:
        self._api_token = api_token
        self._replica_token = replica_token
        self._issuer = issuer
        self._identity = identity

    async def _classify(self, token: str) -> Principal | None:
        if not token:
            return None
        if hmac.compare_digest(token.encode(), self._api_token.encode()):
            return Principal.CLIENT
        try:
            self._issuer.verify(token)
            return Principal.SANDBOX
        except PermissionDeniedError:
            pass
        # Not ours: maybe a driver's bootstrap credential (a Kubernetes one is a JWT too).
        try:
            identity = await self._identity.authenticate(token)
        except PermissionDeniedError:
            return None
        return Principal.SUPERVISOR_BOOTSTRAP if identity is not None else None

    def is_replica(self, context: grpc.aio.ServicerContext[object, object]) -> bool:
        """Whether the call carries the replicas' shared token (a call another replica forwarded)."""
        token = bearer_token(context)
        return bool(token and self._replica_token) and hmac.compare_digest(token.encode(), self._replica_token.encode())

    async def require_client(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        """Only the API token (or, for a forwarded call, the replicas' token) may use the public API."""
        token = bearer_token(context)
        if token and hmac.compare_digest(token.encode(), self._api_token.encode()):
            return
        if self.is_replica(context):
            return
        principal = await self._classify(token)
        if principal is Principal.SUPERVISOR_BOOTSTRAP:
            raise PermissionDeniedError("supervisor bootstrap principals may only register supervisors")
        if principal is Principal.SANDBOX:
            raise PermissionDeniedError("sandbox principals may not call the public API")
        raise Unauthenticated("missing or invalid API token (see <state-dir>/api-token)")

    async def require_sandbox(self, context: CallContext) -> SandboxClaims:
        """Only a valid sandbox JWT may use the supervisor session RPCs."""
        token = bearer_token(context)
        try:
            return self._issuer.verify(token)
        except PermissionDeniedError:
            pass
        principal = await self._classify(token)
        if principal is Principal.SUPERVISOR_BOOTSTRAP:
            raise PermissionDeniedError("supervisor bootstrap principals may only register supervisors")
        if principal is Principal.CLIENT:
            raise PermissionDeniedError("client principals may not call supervisor session RPCs")
        raise Unauthenticated("missing, invalid or expired sandbox token")
