"""Flags shared by every command (where the gateway is, how to print) and local flag parsing.

The command line is built on argparse: it costs a few milliseconds to import where a
decorator-based framework cost a hundred, and scripts and agents pay that on every call. Only
syntax is checked here (`K=V`, numbers); the rules for names, keys and values belong to the
gateway, which names the field and the rule when it refuses a request.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from warmshell.cli.errors import CliError, ExitCode

__all__ = [
    "OUTPUT_FORMATS",
    "Command",
    "Flag",
    "GlobalOptions",
    "Parser",
    "Subcommands",
    "add_connection_options",
    "add_output_option",
    "add_workspace_option",
    "bounded_float",
    "bounded_int",
    "flag",
    "global_options",
    "parse_pairs",
    "usage_error",
    "workspace_flag",
]

OUTPUT_FORMATS = ("human", "json")

# One hint for every stray word: it is almost always a value given to a flag that takes none
# (`--detach true`) or a command written without `--`.
_STRAY_HINT = "flags such as --detach take no value; the command to run goes after `--` (e.g. `-- true`)"


def usage_error(message: str) -> CliError:
    """A usage error (exit 2) with `message`."""
    return CliError(message, ExitCode.USAGE)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are `CliError`s (exit 2, `error: ...` like every other
    failure) rather than a usage dump and a bare exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = f"{_STRAY_HINT}; see `{self.prog} --help`"
        if not message.startswith("unrecognized arguments"):
            hint = f"see `{self.prog} --help`"
        raise CliError(f"{self.prog}: {message}", ExitCode.USAGE, hint=hint)


class Flag(NamedTuple):
    """One argument of a command, as data: argparse's names and keywords."""

    names: tuple[str, ...]
    options: dict[str, Any]


def flag(*names: str, **options: Any) -> Flag:
    """A `Flag`, written as the `add_argument` call it stands for."""
    return Flag(names, options)


class Command(NamedTuple):
    """One subcommand declared as data: what `Subcommands.add_command` needs to build its parser.
    `accepts_command`: it takes a sandbox command after `--`."""

    name: str
    handler: Callable[[argparse.Namespace], int]
    description: str
    flags: tuple[Flag, ...]
    usage: str | None = None
    accepts_command: bool = False


class Subcommands:
    """A group's subcommands (`sandbox create`, `sandbox list`, ...), of which only the one this
    invocation runs gets its flags: building every parser on every call costs more than running
    the command's argument parsing. The others are named with their summary, for `--help`."""

    def __init__(self, commands: Any, name: str, summary: str, *, chosen: str | None) -> None:
        self.group: Parser = commands.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}.")
        self.group.set_defaults(help_parser=self.group)
        self._sub = self.group.add_subparsers(title="commands", metavar="COMMAND")
        self._name = name
        self._chosen = chosen

    def add(
        self, name: str, handler: Callable[[argparse.Namespace], int], description: str, **kw: Any
    ) -> Parser | None:
        """The parser of subcommand `name` when it is the one chosen (add its flags), else None."""
        summary = description.split(". ", 1)[0].split("; ", 1)[0].rstrip(".")
        if name != self._chosen:
            self._sub.add_parser(name, help=f"{summary[0].lower()}{summary[1:]}")
            return None
        parser: Parser = self._sub.add_parser(name, help=summary, description=description, **kw)
        parser.set_defaults(handler=handler, command_name=f"{self._name} {name}")
        return parser

    def add_command(self, command: Command) -> Parser | None:
        """`add` from a `Command`, with its flags added when it is the one chosen."""
        extra = {} if command.usage is None else {"usage": command.usage}
        parser = self.add(command.name, command.handler, command.description, **extra)
        if parser is not None:
            parser.set_defaults(accepts_command=command.accepts_command)
            for each in command.flags:
                parser.add_argument(*each.names, **each.options)
        return parser


class GlobalOptions:
    """Where to reach the gateway; read by every command that talks to one."""

    __slots__ = ("gateway", "state_dir", "token")

    def __init__(self, state_dir: Path | None = None, gateway: str | None = None, token: str | None = None) -> None:
        self.state_dir = state_dir
        self.gateway = gateway
        self.token = token


def add_connection_options(parser: argparse.ArgumentParser, *, root: bool = False) -> None:
    """--state-dir, --gateway and --token. The root parser's land in `root_*` so that the same
    flag given after the command wins (`warmshell --gateway A sandbox list --gateway B` uses B)."""
    prefix = "root_" if root else ""
    group = parser.add_argument_group("gateway connection")
    group.add_argument(
        "--state-dir",
        dest=f"{prefix}state_dir",
        type=Path,
        metavar="DIR",
        help="gateway state directory (env WARMSHELL_STATE_DIR; default $XDG_STATE_HOME/warmshell)",
    )
    group.add_argument(
        "--gateway",
        dest=f"{prefix}gateway",
        metavar="ADDR",
        help="unix:///path, /path or host:port (env WARMSHELL_GATEWAY; default: the state directory's socket)",
    )
    group.add_argument(
        "--token",
        dest=f"{prefix}token",
        metavar="TOKEN",
        help="API token (env WARMSHELL_API_TOKEN; default: read from <state dir>/api-token)",
    )


def add_output_option(parser: argparse.ArgumentParser) -> None:
    """-o/--output human|json (env WARMSHELL_OUTPUT)."""
    parser.add_argument(
        "-o",
        "--output",
        type=str.lower,
        choices=OUTPUT_FORMATS,
        default=None,
        help="output format: human (default) or json (env WARMSHELL_OUTPUT)",
    )


def workspace_flag(what: str) -> Flag:
    """-w/--workspace (env WARMSHELL_WORKSPACE); `what` says whose workspace it is."""
    return flag(
        "-w",
        "--workspace",
        default=None,
        metavar="NAME",
        help=f"workspace of the {what} (env WARMSHELL_WORKSPACE; default: the gateway's, `default`)",
    )


def add_workspace_option(parser: argparse.ArgumentParser, *, what: str) -> None:
    """Add `workspace_flag(what)` to `parser`."""
    option = workspace_flag(what)
    parser.add_argument(*option.names, **option.options)


def workspace(args: argparse.Namespace) -> str:
    """The workspace flag, else $WARMSHELL_WORKSPACE, else "" (the gateway's default)."""
    value: str | None = args.workspace
    return value if value is not None else os.environ.get("WARMSHELL_WORKSPACE", "")


def output_is_json(args: argparse.Namespace) -> bool:
    """Whether -o json (or WARMSHELL_OUTPUT=json) was asked for."""
    value: str | None = args.output
    if value is None:
        value = os.environ.get("WARMSHELL_OUTPUT", "human").lower()
        if value not in OUTPUT_FORMATS:
            raise usage_error(f"WARMSHELL_OUTPUT={value!r}: must be one of {', '.join(OUTPUT_FORMATS)}")
    return value == "json"


def global_options(args: argparse.Namespace) -> GlobalOptions:
    """The connection flags of this invocation: the command's, else the root's. What is not given
    is filled by the SDK as for every caller (`warmshell.sdk.connection.resolve`: the
    WARMSHELL_* environment, then the state directory's socket and token file)."""

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return value if value is not None else getattr(args, f"root_{name}", None)

    return GlobalOptions(state_dir=pick("state_dir"), gateway=pick("gateway"), token=pick("token"))


def bounded_float(minimum: float) -> Callable[[str], float]:
    """An argparse type: a float no smaller than `minimum`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{text} is less than {minimum:g}")
        return value

    return parse


def bounded_int(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is not in {minimum}..{maximum}")
        return value

    return parse


def parse_pairs(values: Sequence[str], *, flag: str) -> dict[str, str]:
    """Turn repeated `--flag K=V` values into a dict; a malformed or repeated key is a usage error.

    Values may contain `=` (only the first one splits), and may be empty (`FOO=`).
    """
    pairs: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise usage_error(f"{flag}: {raw!r} is not of the form KEY=VALUE")
        if key in pairs:
            raise usage_error(f"{flag}: {key!r} is given more than once")
        pairs[key] = value
    return pairs


def parse_secrets(values: Sequence[str], files: Sequence[str]) -> dict[str, str]:
    """`--secret KEY=VALUE` and `--secret-file KEY=PATH` (the file's text, one trailing newline
    dropped) as one dict. Errors name the flag and the key, never a value."""
    secrets: dict[str, str] = {}

    def add(flag: str, raw: str) -> tuple[str, str]:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise usage_error(f"{flag}: an argument is not of the form KEY=VALUE (value not shown)")
        if key in secrets:
            raise usage_error(f"{flag}: {key!r} is given more than once")
        return key, value

    for raw in values:
        key, value = add("--secret", raw)
        secrets[key] = value
    for raw in files:
        key, path = add("--secret-file", raw)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise usage_error(f"--secret-file: {key}: cannot read {path}: {exc}") from None
        secrets[key] = text[:-1] if text.endswith("\n") else text
    return secrets
