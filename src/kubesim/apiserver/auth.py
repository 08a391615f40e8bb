"""Authentication (bearer token → ``User``) and the single authorization hook.

Static tokens (the default user and the controllers' admin) are looked up in a dict; anything that
looks like a JWT is checked as a service-account token issued by ``tokens.TokenIssuer``. Every
request passes through ``Authorizer.authorize`` once, after routing (plus once per ``Impersonate-*``
header); ``ServerConfig(rbac=True)`` plugs ``rbac_authorizer.RbacAuthorizer`` in there.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from kubesim.apiserver import tokens


@dataclass(frozen=True)
class User:
    """An authenticated identity, as a real server's ``user.Info``."""

    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))

# Who the request being served is (set by the HTTP handler, per request task). Checks deep in the
# write path (RBAC escalation prevention) read it; in-process writers (built-in controllers, test
# setup) leave it unset and act as the server itself.
CURRENT_USER: ContextVar[User | None] = ContextVar("kubesim_current_user", default=None)


@dataclass(frozen=True)
class Attributes:
    """What a request wants to do, in RBAC's vocabulary."""

    user: User
    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


class Authorizer(Protocol):
    """Decides whether a request may proceed: ``None`` allows, a string is the denial reason.

    The handler turns a denial into upstream's 403 message (``rbac.forbidden_message``), appending
    a non-empty reason after a colon; ``rbac_authorizer.RbacAuthorizer`` is the real one.
    """

    def authorize(self, attrs: Attributes) -> str | None: ...


class AllowAll:
    """The default: every authenticated request is allowed (RBAC comes later)."""

    def authorize(self, attrs: Attributes) -> str | None:
        """Allow everything."""
        return None


class Authenticator:
    """Maps the ``Authorization`` header to a ``User``."""

    def __init__(self, static: dict[str, User], issuer: tokens.TokenIssuer, api_audiences: list[str]) -> None:
        self.static = static
        self.issuer = issuer
        self.api_audiences = api_audiences
        # Hook for service-account tokens: set by the server to check the SA/pod still exist.
        self.sa_validator: tokens.Validator | None = None

    def authenticate(self, header: str | None) -> User | None:
        """The user for this header, ``ANONYMOUS`` without one, ``None`` if it is invalid."""
        if not header:
            return ANONYMOUS
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        user = self.static.get(token.strip())
        if user is not None:
            return user
        return self.user_for_jwt(token.strip(), self.api_audiences)

    def user_for_jwt(self, token: str, audiences: list[str]) -> User | None:
        """A service-account user if the token verifies for one of ``audiences``."""
        try:
            result = self.issuer.verify(token, audiences, self.sa_validator)
        except tokens.TokenInvalid:
            return None
        return User(result.username, tuple(result.groups), result.uid, result.extra)
