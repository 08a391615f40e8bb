"""What the SDK raises: one named exception per gRPC status a caller acts on, and SandboxError
for a sandbox that failed on its own. A raw `grpc.RpcError` never escapes the SDK; `translating`
is the one place it is converted, for the sync and the async client alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import grpc

from warmshell.sdk import connection

if TYPE_CHECKING:
    from warmshell.sdk.views import SandboxInfo

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "DeadlineExceeded",
    "Error",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "SandboxError",
    "Unauthenticated",
    "Unavailable",
    "error_for",
    "translating",
]

_START_HINT = "is the gateway running? Start one with `warmshell gateway start`."
_TOKEN_HINT = (
    "the API token is read from <state dir>/api-token; pass token= or set WARMSHELL_API_TOKEN "
    "when the gateway runs elsewhere."
)


class Error(Exception):
    """Base of everything the SDK raises on purpose."""


class ApiError(Error):
    """The gateway refused or failed a call. `code` is the gRPC status name (e.g. "NOT_FOUND"),
    `details` the gateway's message; codes without a class of their own raise this."""

    def __init__(self, details: str, *, code: str, hint: str = "") -> None:
        super().__init__(f"{details} (hint: {hint})" if hint else details)
        self.details = details
        self.code = code
        self.hint = hint


class NotFound(ApiError):
    """The sandbox (or other object) does not exist."""


class AlreadyExists(ApiError):
    """A sandbox with that name already exists in the workspace."""


class InvalidArgument(ApiError):
    """A request field broke a rule; `field` names it ("" when the gateway did not) and `rule`
    says what the rule is."""

    def __init__(self, details: str, *, code: str = "INVALID_ARGUMENT", hint: str = "") -> None:
        super().__init__(details, code=code, hint=hint)
        field, sep, rule = details.partition(": ")
        self.field = field if sep else ""
        self.rule = rule if sep else details


class FailedPrecondition(ApiError):
    """The sandbox is not in a state that allows the call (e.g. run in a sandbox not Ready)."""


class Conflict(ApiError):
    """The state moved under the request (a lost compare-and-swap); retrying may succeed."""


class PermissionDenied(ApiError):
    """The caller's identity does not allow the call."""


class Unauthenticated(ApiError):
    """No token, or one the gateway does not accept."""


class Unavailable(ApiError):
    """The gateway cannot be reached, or failed temporarily; the outcome may be unknown."""


class ResourceExhausted(ApiError):
    """A request too large, or a rate limit hit."""


class DeadlineExceeded(ApiError, TimeoutError):
    """The call (or the wait for a sandbox) did not finish in time."""


class SandboxError(Error):
    """The sandbox itself failed (Error, deleted, or gone) while the SDK waited on it.

    `reason` and `message` are the gateway's own (the Ready condition's), `sandbox` the last
    state seen (None when it was deleted before any was)."""

    def __init__(self, message: str, *, reason: str = "", sandbox: SandboxInfo | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.sandbox = sandbox


_CLASSES: dict[grpc.StatusCode, type[ApiError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_for(code: grpc.StatusCode, details: str, *, address: str = "") -> ApiError:
    """The exception for a failed call's status (pure: the whole mapping, unit-tested)."""
    details = details or code.name
    kind = _CLASSES.get(code, ApiError)
    if kind is Unavailable:
        where = f"gateway at {address}" if address else "gateway"
        return Unavailable(f"{where} is unavailable: {details}", code=code.name, hint=_START_HINT)
    if kind is Unauthenticated:
        return Unauthenticated(details, code=code.name, hint=_TOKEN_HINT)
    if kind is InvalidArgument:
        return InvalidArgument(details, code=code.name)
    return kind(details, code=code.name)


@contextmanager
def translating(address: str) -> Iterator[None]:
    """Turn a failed RPC inside the block into the matching SDK exception."""
    try:
        yield
    except grpc.RpcError as exc:
        call = cast(grpc.Call, exc)  # every RpcError grpc raises for a call is also a Call
        code, details = call.code(), call.details() or ""
        socket = connection.unix_socket_path(address)
        if code is grpc.StatusCode.UNAVAILABLE and socket is not None and not socket.exists():
            details = f"no gateway socket at {socket}"
        raise error_for(code, details, address=address) from None
