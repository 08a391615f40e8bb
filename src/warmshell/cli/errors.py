"""Exit codes the CLI promises to scripts, and the error every command raises to end with one.

Kept free of the SDK so that `--help` and argument parsing never pay for importing it; the one
map from gRPC status names to these exit codes lives in `warmshell.cli.client`.
"""

from __future__ import annotations

import sys
from enum import IntEnum

__all__ = ["EXIT_CODE_HELP", "CliError", "ExitCode", "exit_code_for", "report"]


class ExitCode(IntEnum):
    """What a `warmshell` process exit status means (see EXIT_CODE_HELP)."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    NOT_FOUND = 3
    ALREADY_EXISTS = 4
    INVALID_ARGUMENT = 5
    FAILED_PRECONDITION = 6
    SANDBOX_FAILED = 7
    UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE
    UNAUTHENTICATED = 77  # sysexits EX_NOPERM
    TIMEOUT = 124  # what timeout(1) uses
    INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


# Shown in `warmshell --help` and mirrored in the module docstring of warmshell.cli.main.
EXIT_CODE_HELP = (
    "Exit codes: 0 success; the command's own exit code for `sandbox exec` and "
    "`sandbox create -- CMD`; 1 other failure; 2 usage error; 3 not found; 4 already exists; "
    "5 invalid argument (the gateway names the field and the rule); 6 failed precondition "
    "(e.g. exec in a sandbox that is not Ready); 7 the sandbox went to Error before Ready; "
    "69 gateway unreachable; 77 unauthenticated or permission denied; 124 timed out; "
    "130 interrupted."
)


class CliError(Exception):
    """A failure to report as `error: <message>` (plus an optional hint) and exit with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint


def exit_code_for(error: Exception) -> ExitCode:
    """The exit code for a domain error raised in-process (by `gateway start`, not over gRPC)."""
    from warmshell.core import errors

    by_type: tuple[tuple[type[Exception], ExitCode], ...] = (
        (errors.InvalidArgumentError, ExitCode.INVALID_ARGUMENT),
        (errors.NotFoundError, ExitCode.NOT_FOUND),
        (errors.AlreadyExistsError, ExitCode.ALREADY_EXISTS),
        (errors.FailedPreconditionError, ExitCode.FAILED_PRECONDITION),
        (errors.PermissionDeniedError, ExitCode.UNAUTHENTICATED),
        (errors.UnavailableError, ExitCode.UNAVAILABLE),
    )
    for kind, code in by_type:
        if isinstance(error, kind):
            return code
    return ExitCode.FAILURE


def report(error: CliError) -> None:
    """`error: <message>` on stderr (plain text: gateway messages are not markup), then the hint."""
    print(f"error: {error.message}", file=sys.stderr)
    if error.hint:
        print(f"hint: {error.hint}", file=sys.stderr)
