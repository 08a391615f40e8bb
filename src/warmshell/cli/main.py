"""`warmshell`, the command line: run a gateway, manage sandboxes, inspect warm pools.

Exit codes scripts can rely on (warmshell.cli.errors.ExitCode):

    0    success
    N    `sandbox exec` and `sandbox create -- CMD`: the command's own exit code
    1    any other failure
    2    usage error (bad flags, malformed K=V)
    3    not found
    4    already exists
    5    invalid argument (the gateway names the field and the rule)
    6    failed precondition (e.g. exec in a sandbox that is not Ready)
    7    the sandbox went to Error before it was Ready
    8    permission denied (e.g. a read-only path in the sandbox)
    9    resource exhausted (a full disk, a file or request over a limit, a rate limit)
    69   gateway unreachable (EX_UNAVAILABLE)
    77   unauthenticated: no or a wrong API token (EX_NOPERM)
    124  timed out
    130  interrupted (Ctrl-C)

A command's own exit code can collide with these; `-o json` shows which it was.

Every call starts a new interpreter, so start-up is part of every command's latency: this module
imports only argparse and the command modules' parsers; protobuf, the SDK and the renderers are
imported by the command that runs, and the SDK talks to a local gateway through its light HTTP/2
transport, so grpc and asyncio are never imported for gateway calls (bench/cli_latency.py
measures it; tests/e2e/test_cli_imports.py guards it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import warmshell
from warmshell.cli import gateway, image, pool, sandbox, store
from warmshell.cli.errors import EXIT_CODE_HELP, CliError, report
from warmshell.cli.options import Parser, add_connection_options, usage_error

__all__ = ["build_parser", "main", "run"]


# Root flags that take a value: the word after one is not a command name.
_ROOT_VALUE_FLAGS = frozenset({"--state-dir", "--gateway", "--token"})
_GROUPS = {
    "gateway": gateway.register,
    "sandbox": sandbox.register,
    "pool": pool.register,
    "store": store.register,
    "image": image.register,
}


def _chosen(flags: Sequence[str]) -> tuple[str | None, str | None]:
    """The group and subcommand names this invocation runs (`sandbox`, `list`), if given."""
    words: list[str] = []
    skip = False
    for word in flags:
        if skip:
            skip = False
        elif word in _ROOT_VALUE_FLAGS:
            skip = True
        elif not word.startswith("-"):
            words.append(word)
            if len(words) == 2:
                break
    return (words[0] if words else None), (words[1] if len(words) > 1 else None)


def build_parser(flags: Sequence[str] = ()) -> Parser:
    """The command tree; only the subcommand `flags` name gets its own flags (see Subcommands)."""
    parser = Parser(
        prog="warmshell",
        description="warmshell: sandboxes for AI agents, served from warm pools.",
        epilog=EXIT_CODE_HELP,
    )
    parser.add_argument("--version", action="version", version=f"warmshell {warmshell.__version__}")
    add_connection_options(parser, root=True)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    group, subcommand = _chosen(flags)
    for name, register in _GROUPS.items():
        register(commands, chosen=subcommand if name == group else None)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    # Everything after the first `--` is a sandbox's command, verbatim: flags there belong to it.
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, None


def run(argv: Sequence[str]) -> int:
    """Parse `argv` (without the program name), run the command, return its exit code."""
    flags, command = _split_command(list(argv))
    parser = build_parser(flags)
    try:
        args = parser.parse_args(flags)
        handler = getattr(args, "handler", None)
        if handler is None:
            # `warmshell` or `warmshell sandbox` alone: show what there is to run.
            helper: argparse.ArgumentParser = getattr(args, "help_parser", parser)
            helper.print_help()
            return 2
        accepts_command = getattr(args, "accepts_command", False)
        if command is not None and not accepts_command:
            raise usage_error(f"{args.command_name} takes no command after `--`")
        args.command = command
        code: int = handler(args)
        return code
    except CliError as exc:
        report(exc)
        return int(exc.code)


def main() -> None:
    """Console-script entry point."""
    argv = sys.argv[1:]
    if argv[:1] == ["supervisor"]:
        # A Kubernetes pod's entry point is `warmshell supervisor` (the image's ENTRYPOINT is this
        # script): hand over before the CLI is parsed, as `python -m warmshell supervisor` does.
        from warmshell.supervisor.main import main as supervisor_main

        sys.exit(supervisor_main(argv[1:]))
    if argv[:1] == ["install-agent"]:
        # The init container of pods an older gateway rendered (this one's run the agent's own
        # `warmshell-agent --install`): copies the static agent for the workload.
        from warmshell.drivers.local.runtime.agent.installing import main as install_main

        sys.exit(install_main(argv[1:]))
    try:
        code = run(argv)
        sys.stdout.flush()  # here, where a closed pipe can be handled, not at interpreter exit
    except BrokenPipeError:
        import signal

        # The reader went away (`sandbox get X | head -1`): stop quietly, as a program killed
        # by SIGPIPE would, instead of a traceback. Python ignores SIGPIPE, so writes raise
        # EPIPE; stdout points at /dev/null so the exit's own flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    sys.exit(code)
