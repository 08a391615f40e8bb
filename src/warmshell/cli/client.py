"""The CLI's side of the wire: where the gateway is, the bearer token, and what a gRPC failure
means to a script (the single map from gRPC status codes to exit codes).

Commands open a `Connection` with `connect()`, call the stub, and return an exit code from an
async function that `run()` drives; every failure surfaces as a `CliError`. This is the whole
client layer of the CLI, kept small: the CLI moves onto the SDK (`warmshell.sdk`) once that lands.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
from grpc import aio

from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.cli.errors import CliError, ExitCode, report
from warmshell.cli.options import GlobalOptions
from warmshell.core import paths
from warmshell.sdk import connection

if TYPE_CHECKING:
    from warmshell.api.v1.sandbox_pb2_grpc import SandboxServiceAsyncStub

__all__ = [
    "STATUS_EXIT_CODES",
    "UNARY_TIMEOUT_SECONDS",
    "Connection",
    "connect",
    "error_from_rpc",
    "resolve_address",
    "resolve_token",
    "run",
]

# Unary calls do bounded work on the gateway; a hung gateway should not hang a script forever.
UNARY_TIMEOUT_SECONDS = 60.0

STATUS_EXIT_CODES: dict[grpc.StatusCode, ExitCode] = {
    grpc.StatusCode.OK: ExitCode.OK,
    grpc.StatusCode.CANCELLED: ExitCode.FAILURE,
    grpc.StatusCode.UNKNOWN: ExitCode.FAILURE,
    grpc.StatusCode.INVALID_ARGUMENT: ExitCode.INVALID_ARGUMENT,
    grpc.StatusCode.DEADLINE_EXCEEDED: ExitCode.TIMEOUT,
    grpc.StatusCode.NOT_FOUND: ExitCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: ExitCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED: ExitCode.UNAUTHENTICATED,
    # The gateway answers an oversized request this way; to a user it is a bad argument.
    grpc.StatusCode.RESOURCE_EXHAUSTED: ExitCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION: ExitCode.FAILED_PRECONDITION,
    # A lost compare-and-swap race: the state moved under the request, like a precondition.
    grpc.StatusCode.ABORTED: ExitCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE: ExitCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED: ExitCode.FAILURE,
    grpc.StatusCode.INTERNAL: ExitCode.FAILURE,
    grpc.StatusCode.UNAVAILABLE: ExitCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS: ExitCode.FAILURE,
    grpc.StatusCode.UNAUTHENTICATED: ExitCode.UNAUTHENTICATED,
}

_START_HINT = "is the gateway running? Start one with `warmshell gateway start`."
_TOKEN_HINT = (
    "the API token is read from <state dir>/api-token; pass --token or set WARMSHELL_API_TOKEN "
    "when the gateway runs elsewhere."
)


class Connection(NamedTuple):
    """An open channel's stub plus the call metadata that authenticates us."""

    stub: SandboxServiceAsyncStub
    metadata: tuple[tuple[str, str], ...]
    address: str


def _state_dir(options: GlobalOptions) -> Path:
    return options.state_dir if options.state_dir is not None else paths.default_state_dir()


def resolve_address(options: GlobalOptions) -> str:
    """A gRPC target: `--gateway` (unix:///path, a bare /path, or host:port), else the state
    directory's socket (decided as the SDK decides it)."""
    return connection.target_address(options.gateway, _state_dir(options))


def resolve_token(options: GlobalOptions) -> str | None:
    """`--token`, else the state directory's token file, else none (the gateway will refuse)."""
    if options.token:
        return options.token
    path = paths.StatePaths(_state_dir(options)).api_token
    try:
        return connection.read_token_file(path)
    except OSError as exc:
        raise CliError(f"cannot read the API token at {path}: {exc.strerror}", ExitCode.UNAUTHENTICATED) from exc


def _check_socket(address: str) -> None:
    # grpc reports a missing socket file as a generic connect failure; say exactly what is wrong.
    path = connection.unix_socket_path(address)
    if path is not None and not path.exists():
        raise CliError(f"no gateway socket at {path}", ExitCode.UNAVAILABLE, hint=_START_HINT)


def error_from_rpc(exc: aio.AioRpcError, *, address: str) -> CliError:
    """The one translation from a failed RPC to what the user sees and the exit code."""
    status = exc.code()
    code = STATUS_EXIT_CODES.get(status, ExitCode.FAILURE)
    details = exc.details() or status.name
    if status is grpc.StatusCode.UNAVAILABLE:
        return CliError(f"gateway at {address} is unavailable: {details}", code, hint=_START_HINT)
    if status is grpc.StatusCode.UNAUTHENTICATED:
        return CliError(details, code, hint=_TOKEN_HINT)
    return CliError(details, code)


@asynccontextmanager
async def connect(options: GlobalOptions) -> AsyncIterator[Connection]:
    """Open a channel to the gateway; RPC failures inside the block become `CliError`s."""
    address = resolve_address(options)
    _check_socket(address)
    token = resolve_token(options)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with aio.insecure_channel(address) as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        try:
            yield Connection(stub=stub, metadata=metadata, address=address)
        except aio.AioRpcError as exc:
            raise error_from_rpc(exc, address=address) from None


def run(main: Coroutine[Any, Any, int]) -> int:
    """Run a command's coroutine; its exit code, or that of its failure (reported on stderr)."""
    try:
        return asyncio.run(main)
    except CliError as exc:
        report(exc)
        return int(exc.code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
