"""`warmshell store migrate`: the command-line face of `warmshell.gateway.store.migrate` (the
copying itself lives there); parses flags, runs it, prints what was copied."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from warmshell.cli.options import Subcommands, add_output_option, output_is_json

__all__ = ["register"]


def register(commands: Any, *, chosen: str | None) -> None:
    """Add `store` to the root parser's subcommands, with the flags of the `chosen` one."""
    sub = Subcommands(commands, "store", "manage the gateway's store", chosen=chosen)
    migrate = sub.add(
        "migrate",
        _migrate,
        "Copy every object of one store into another, resource versions kept (e.g. a gateway's "
        "SQLite state into the Postgres its replicas will share). Stop the gateways writing to the "
        "source first; rerunning copies only what is missing or newer.",
    )
    if migrate is not None:
        migrate.add_argument(
            "--from", dest="from_url", required=True, metavar="URL", help="sqlite:///path/warmshell.db"
        )
        migrate.add_argument("--to", dest="to_url", required=True, metavar="URL", help="postgresql://user@host:port/db")
        migrate.add_argument(
            "--password-file",
            type=Path,
            metavar="FILE",
            help="the destination's password (else $WARMSHELL_STORE_PASSWORD)",
        )
        add_output_option(migrate)


def _migrate(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from warmshell.cli.errors import CliError, exit_code_for, report
    from warmshell.core import config, errors
    from warmshell.gateway.store import migrate as migrating

    as_json = output_is_json(args)
    to_config = config.StoreConfig(password_file=str(args.password_file) if args.password_file else "")
    try:
        done = asyncio.run(migrating.migrate(args.from_url, args.to_url, to_config=to_config))
    except errors.WarmshellError as exc:
        failure = CliError(str(exc), exit_code_for(exc))
        report(failure)
        return int(failure.code)
    if as_json:
        print(json.dumps({"written": done.written, "unchanged": done.unchanged}, sort_keys=True))
    else:
        print(
            f"copied {done.total_written} objects from {migrating.describe(args.from_url)}"
            f" to {migrating.describe(args.to_url)} ({done.total_unchanged} already there)"
        )
    return 0
