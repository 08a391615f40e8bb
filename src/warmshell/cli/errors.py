"""Exit codes the CLI promises to scripts, and the error every command raises to end with one.

Kept free of the SDK so that `--help` and argument parsing never pay for importing it; the one
map from gRPC status names to these exit codes lives in `warmshell.cli.client`.
"""

from __future__ import annotations

import sys
from enum import IntEnum

__all__ = ["EXIT_CODE_HELP", "CliError", "ExitCode", "exit_code_for", "inert", "report"]

# Gateway messages reach the user's terminal: a control character in one (ESC starting a title
# change or an OSC 52 clipboard write, a C1 CSI) is shown as its escape, never acted on.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"}
MAX_SHOWN = 4096  # characters of one message; a hostile or runaway one is cut


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
    PERMISSION_DENIED = 8
    RESOURCE_EXHAUSTED = 9
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
    "8 permission denied (e.g. a read-only path); 9 resource exhausted (a full disk, a file or "
    "request over a limit, a rate limit); 69 gateway unreachable; 77 unauthenticated; "
    "124 timed out; 130 interrupted."
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
        (errors.PermissionDeniedError, ExitCode.PERMISSION_DENIED),
        (errors.ResourceExhaustedError, ExitCode.RESOURCE_EXHAUSTED),
        (errors.UnavailableError, ExitCode.UNAVAILABLE),
    )
    for kind, code in by_type:
        if isinstance(error, kind):
            return code
    return ExitCode.FAILURE


def inert(text: str, *, limit: int | None = MAX_SHOWN) -> str:
    """`text` safe for a terminal: control characters escaped (not newlines and tabs), and cut
    at `limit` characters (None: whole, for what the CLI rendered from a gateway's answer)."""
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters)"
    return text.translate(_CONTROLS)


def report(error: CliError) -> None:
    """`error: <message>` on stderr (plain text: gateway messages are not markup), then the hint."""
    print(f"error: {inert(error.message)}", file=sys.stderr)
    if error.hint:
        print(f"hint: {inert(error.hint)}", file=sys.stderr)
