"""The CLI's side of the wire, on the SDK: `connect()` opens a `warmshell.sdk.Client` (found,
authenticated and with errors mapped the way every SDK caller's are) on the light HTTP/2
transport when the gateway is a local Unix socket, and `run()` turns what a command raised into
the exit code scripts rely on (the one map from gRPC status names to exit codes is here).

Commands call `client.service` (the SDK's typed SandboxService: protobuf messages, which the
renderers print) and the SDK's helpers in `warmshell.sdk.calls`; nothing here imports grpc.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from warmshell.cli.errors import CliError, ExitCode, report
from warmshell.cli.options import GlobalOptions

if TYPE_CHECKING:
    from warmshell.sdk.client import Client
    from warmshell.sdk.errors import Error

__all__ = ["STATUS_EXIT_CODES", "cli_error", "connect", "run"]

# gRPC status name -> exit code, for every status there is.
STATUS_EXIT_CODES: dict[str, ExitCode] = {
    "OK": ExitCode.OK,
    "CANCELLED": ExitCode.FAILURE,
    "UNKNOWN": ExitCode.FAILURE,
    "INVALID_ARGUMENT": ExitCode.INVALID_ARGUMENT,
    "DEADLINE_EXCEEDED": ExitCode.TIMEOUT,
    "NOT_FOUND": ExitCode.NOT_FOUND,
    "ALREADY_EXISTS": ExitCode.ALREADY_EXISTS,
    # Apart from UNAUTHENTICATED: a read-only path is not a wrong token.
    "PERMISSION_DENIED": ExitCode.PERMISSION_DENIED,
    # A full disk, a file over [files] max_file_bytes, an oversized request, a rate limit.
    "RESOURCE_EXHAUSTED": ExitCode.RESOURCE_EXHAUSTED,
    "FAILED_PRECONDITION": ExitCode.FAILED_PRECONDITION,
    # A lost compare-and-swap race: the state moved under the request, like a precondition.
    "ABORTED": ExitCode.FAILED_PRECONDITION,
    "OUT_OF_RANGE": ExitCode.INVALID_ARGUMENT,
    "UNIMPLEMENTED": ExitCode.FAILURE,
    "INTERNAL": ExitCode.FAILURE,
    "UNAVAILABLE": ExitCode.UNAVAILABLE,
    "DATA_LOSS": ExitCode.FAILURE,
    "UNAUTHENTICATED": ExitCode.UNAUTHENTICATED,
}

# The SDK's own hint names its `token=` argument; a CLI user has flags.
_TOKEN_HINT = (
    "the API token is read from <state dir>/api-token; pass --token or set WARMSHELL_API_TOKEN "
    "when the gateway runs elsewhere."
)


def cli_error(error: Error) -> CliError:
    """What the user sees, and the exit code, for an SDK exception."""
    from warmshell.sdk import errors

    if isinstance(error, errors.ApiError):
        code = STATUS_EXIT_CODES.get(error.code, ExitCode.FAILURE)
        hint = _TOKEN_HINT if error.code == "UNAUTHENTICATED" else error.hint
        return CliError(error.details, code, hint=hint)
    if isinstance(error, errors.SandboxError):
        return CliError(error.message, ExitCode.SANDBOX_FAILED)
    return CliError(str(error), ExitCode.FAILURE)


@contextmanager
def connect(options: GlobalOptions, *, timeout: float | None = None) -> Iterator[Client]:
    """An SDK client for this invocation's gateway (flags, then environment, then the state
    directory), closed at the end of the block; `timeout` bounds each unary call."""
    from warmshell.sdk import calls
    from warmshell.sdk.client import Client

    client = Client(
        options.gateway,
        options.token,
        state_dir=options.state_dir,
        timeout=calls.UNARY_TIMEOUT_SECONDS if timeout is None else timeout,
        transport="http2",
    )
    try:
        yield client
    finally:
        client.close()


def run_connected(options: GlobalOptions, body: Callable[[Client], int]) -> int:
    """`run` a command's `body` on an SDK client for this invocation's gateway (`connect`)."""

    def connected() -> int:
        with connect(options) as sdk:
            return body(sdk)

    return run(connected)


def run(command: Callable[[], int]) -> int:
    """Run a command; its exit code, or that of its failure (reported on stderr)."""
    from warmshell.sdk.errors import Error

    try:
        return command()
    except Error as exc:
        failure = cli_error(exc)
    except CliError as exc:
        failure = exc
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    report(failure)
    return int(failure.code)
