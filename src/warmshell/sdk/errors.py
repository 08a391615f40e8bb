"""What the SDK raises: one named exception per gRPC status a caller acts on, and SandboxError
for a sandbox that failed on its own. A raw `grpc.RpcError` never escapes the SDK: `error_for`
is the one map from a status to an exception, used by `translating` (grpcio, sync and async)
and by the HTTP/2 transport alike.

Free of grpc (it is imported by `translating` when that runs), so the CLI can use these names
without paying for importing it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import grpc

    from warmshell.sdk.views import ExecResult, SandboxInfo

__all__ = [
    "AlreadyExists",
    "ApiError",
    "CommandFailed",
    "CommandTimeout",
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
    "check_result",
    "error_for",
    "from_rpc_error",
    "no_gateway_socket",
    "translating",
]

_START_HINT = "is the gateway running? Start one with `warmshell gateway start`."
_TOKEN_HINT = (
    "the API token is read from <state dir>/api-token; pass token= or set WARMSHELL_API_TOKEN "
    "when the gateway runs elsewhere."
)


# A stream the server refused before it started it (HTTP/2 REFUSED_STREAM, RFC 9113 8.7): a
# connection past the gateway's concurrent streams (grpcio's words, then the HTTP/2 transport's).
_REFUSED_STREAM = re.compile(r"RST_STREAM with error code 7\b|HTTP/2 error 7\)")
_REFUSED_HINT = (
    "run fewer calls at once on one client (the gateway allows a bounded number of concurrent "
    "calls per connection), or retry with a backoff."
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
    """The gateway cannot be reached, or failed temporarily; the outcome may be unknown (a call
    refused for too many concurrent calls on one connection was not started: safe to retry)."""


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


# How much of a failed command's stderr its CommandFailed quotes: enough for the last error
# lines of a compiler or a test run, short enough for a log line.
STDERR_TAIL_BYTES = 2000


class CommandFailed(Error):
    """A command run with `check=True` exited non-zero or never started. `result` is its
    ExecResult; the message names the command, its exit code (or why it never started) and
    the tail of its stderr."""

    def __init__(self, argv: list[str], result: ExecResult) -> None:
        command = " ".join(argv)
        if result.error is not None:
            message = f"{command!r} never started: {result.outcome.error_message}"
        elif result.timed_out:
            message = f"{command!r} timed out (killed after its timeout)"
        else:
            message = f"{command!r} exited {result.exit_code}"
        tail = result.stderr[-STDERR_TAIL_BYTES:].decode(errors="replace").rstrip()
        super().__init__(f"{message}; stderr ends:\n{tail}" if tail else message)
        self.argv = argv
        self.result = result
        self.exit_code = result.exit_code
        self.stderr_tail = tail


class CommandTimeout(CommandFailed, TimeoutError):
    """A command run with `check=True` was killed at its timeout."""


def check_result(argv: list[str], result: ExecResult) -> ExecResult:
    """`result` when the command ran and exited 0; else CommandTimeout or CommandFailed."""
    if result.timed_out:
        raise CommandTimeout(argv, result)
    if not result.ok:
        raise CommandFailed(argv, result)
    return result


# gRPC status name -> the exception raised for it; the others raise ApiError itself.
_CLASSES: dict[str, type[ApiError]] = {
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "INVALID_ARGUMENT": InvalidArgument,
    "OUT_OF_RANGE": InvalidArgument,
    "FAILED_PRECONDITION": FailedPrecondition,
    "ABORTED": Conflict,
    "PERMISSION_DENIED": PermissionDenied,
    "UNAUTHENTICATED": Unauthenticated,
    "UNAVAILABLE": Unavailable,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
}


def error_for(code: str, details: str, *, address: str = "") -> ApiError:
    """The exception for a failed call's status name, e.g. "NOT_FOUND" (pure: the whole
    mapping, unit-tested)."""
    details = details or code
    kind = _CLASSES.get(code, ApiError)
    if kind is Unavailable:
        where = f"gateway at {address}" if address else "gateway"
        if _REFUSED_STREAM.search(details):
            # Not "is the gateway running?": it is, and it said no to this one call.
            message = (
                f"the {where} refused the call: this connection already carries as many concurrent "
                "calls as it allows; the call was not started, so it is safe to retry"
            )
            return Unavailable(message, code=code, hint=_REFUSED_HINT)
        return Unavailable(f"{where} is unavailable: {details}", code=code, hint=_START_HINT)
    if kind is Unauthenticated:
        return Unauthenticated(details, code=code, hint=_TOKEN_HINT)
    if kind is InvalidArgument:
        return InvalidArgument(details, code=code)
    return kind(details, code=code)


def no_gateway_socket(path: Path) -> Unavailable:
    """What a call to a Unix socket that does not exist raises (says exactly what is wrong,
    where grpc reports a generic connect failure)."""
    return Unavailable(f"no gateway socket at {path}", code="UNAVAILABLE", hint=_START_HINT)


def from_rpc_error(exc: grpc.RpcError, *, address: str = "") -> ApiError:
    """The SDK exception for a failed grpcio RPC (what `translating` raises; files use it)."""
    import grpc

    from warmshell.sdk import connection

    call = cast(grpc.Call, exc)  # every RpcError grpc raises for a call is also a Call
    code, details = call.code(), call.details() or ""
    socket = connection.unix_socket_path(address)
    if code is grpc.StatusCode.UNAVAILABLE and socket is not None and not socket.exists():
        return no_gateway_socket(socket)
    return error_for(code.name, details, address=address)


@contextmanager
def translating(address: str) -> Iterator[None]:
    """Turn a failed grpcio RPC inside the block into the matching SDK exception."""
    import grpc

    try:
        yield
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, address=address) from None
