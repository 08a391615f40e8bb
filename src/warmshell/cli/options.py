"""Options shared by every command (where the gateway is, how to print) and local flag parsing.

Only syntax is checked here (`K=V`); the rules for names, keys and values belong to the gateway,
which names the field and the rule when it refuses a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "Gateway",
    "GlobalOptions",
    "Output",
    "OutputFormat",
    "StateDir",
    "Token",
    "Workspace",
    "global_options",
    "parse_pairs",
]


class OutputFormat(StrEnum):
    """`human` for people (rich tables, live status), `json` for scripts."""

    HUMAN = "human"
    JSON = "json"


Output = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        envvar="WARMSHELL_OUTPUT",
        case_sensitive=False,
        help="Output format: human or json.",
    ),
]

Workspace = Annotated[
    str,
    typer.Option(
        "--workspace",
        "-w",
        envvar="WARMSHELL_WORKSPACE",
        help="Workspace of the sandbox (empty: the gateway's default, `default`).",
    ),
]


_PANEL = "Gateway connection"

StateDir = Annotated[
    Path | None,
    typer.Option(
        envvar="WARMSHELL_STATE_DIR",
        help="Gateway state directory (default: $XDG_STATE_HOME/warmshell).",
        rich_help_panel=_PANEL,
    ),
]

Gateway = Annotated[
    str | None,
    typer.Option(
        "--gateway",
        envvar="WARMSHELL_GATEWAY",
        metavar="ADDR",
        help="unix:///path or host:port (default: the state directory's socket).",
        rich_help_panel=_PANEL,
    ),
]

Token = Annotated[
    str | None,
    typer.Option(
        envvar="WARMSHELL_API_TOKEN",
        help="API token (default: read from <state dir>/api-token).",
        rich_help_panel=_PANEL,
    ),
]


@dataclass(frozen=True)
class GlobalOptions:
    """Where to reach the gateway; set by the root callback, read by every command."""

    state_dir: Path | None = None
    gateway: str | None = None
    token: str | None = None


def global_options(
    ctx: typer.Context,
    *,
    state_dir: Path | None = None,
    gateway: str | None = None,
    token: str | None = None,
) -> GlobalOptions:
    """The connection options of this invocation: those given after the command win over those
    given before it (`warmshell --gateway A sandbox list --gateway B` talks to B)."""
    root = ctx.find_object(GlobalOptions) or GlobalOptions()
    return GlobalOptions(
        state_dir=state_dir if state_dir is not None else root.state_dir,
        gateway=gateway if gateway is not None else root.gateway,
        token=token if token is not None else root.token,
    )


def parse_pairs(values: Sequence[str], *, flag: str) -> dict[str, str]:
    """Turn repeated `--flag K=V` values into a dict; a malformed or repeated key is a usage error.

    Values may contain `=` (only the first one splits), and may be empty (`FOO=`).
    """
    pairs: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{raw!r} is not of the form KEY=VALUE", param_hint=flag)
        if key in pairs:
            raise typer.BadParameter(f"{key!r} is given more than once", param_hint=flag)
        pairs[key] = value
    return pairs
