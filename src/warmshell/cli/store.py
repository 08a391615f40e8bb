"""`warmshell store migrate`: the command-line face of `warmshell.gateway.store.migrate` (the
copying itself lives there); parses flags, runs it, prints what was copied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from warmshell.cli.options import Output, OutputFormat

__all__ = ["app"]

app = typer.Typer(help="Manage the gateway's store.", no_args_is_help=True)


@app.command()
def migrate(
    from_url: Annotated[
        str, typer.Option("--from", metavar="URL", help="Source store, e.g. sqlite:///path/warmshell.db")
    ],
    to_url: Annotated[str, typer.Option("--to", metavar="URL", help="Destination, e.g. postgresql://user@host/db")],
    password_file: Annotated[
        Path | None, typer.Option(help="Destination password (else $WARMSHELL_STORE_PASSWORD).", dir_okay=False)
    ] = None,
    output: Output = OutputFormat.HUMAN,
) -> None:
    """Copy every object into another store, resource versions kept. Safe to rerun; stop the
    gateways writing to the source first."""
    raise typer.Exit(_run(from_url, to_url, password_file, output))


def _run(from_url: str, to_url: str, password_file: Path | None, output: OutputFormat) -> int:
    import asyncio

    from warmshell.cli import client
    from warmshell.cli.errors import CliError, exit_code_for
    from warmshell.core import config, errors
    from warmshell.gateway.store import migrate as migrating

    to_config = config.StoreConfig(password_file=str(password_file) if password_file else "")
    try:
        report = asyncio.run(migrating.migrate(from_url, to_url, to_config=to_config))
    except errors.WarmshellError as exc:
        client.report(CliError(str(exc), exit_code_for(exc)))
        return int(exit_code_for(exc))
    if output is OutputFormat.JSON:
        print(json.dumps({"written": report.written, "unchanged": report.unchanged}, sort_keys=True))
    else:
        print(
            f"copied {report.total_written} objects from {migrating.describe(from_url)} to {migrating.describe(to_url)}"
            f" ({report.total_unchanged} already there)"
        )
    return 0
