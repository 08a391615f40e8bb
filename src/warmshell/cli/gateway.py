"""`warmshell gateway start`: build the gateway's configuration from a file and flags, then run
it in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from warmshell.cli.options import global_options

__all__ = ["app"]

app = typer.Typer(help="Run the gateway.", no_args_is_help=True)


class DriverName(StrEnum):
    """Compute drivers the gateway can run with."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


@app.command()
def start(
    ctx: typer.Context,
    state_dir: Annotated[Path | None, typer.Option(help="State directory (socket, token, database).")] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="Gateway config (TOML).", dir_okay=False)] = None,
    listen_tcp: Annotated[str | None, typer.Option(metavar="HOST:PORT", help="Also serve the API over TCP.")] = None,
    http_port: Annotated[
        int | None,
        typer.Option(help="Port of /healthz and /metrics (0: any free port).", min=0, max=65535),
    ] = None,
    driver: Annotated[DriverName | None, typer.Option(help="Compute driver.")] = None,
    pools: Annotated[Path | None, typer.Option(help="Directory of warm-pool.toml profiles (local driver).")] = None,
    allow_unisolated: Annotated[
        bool,
        typer.Option(
            "--allow-unisolated",
            help="Run sandboxes as plain processes when bubblewrap is missing (no isolation).",
        ),
    ] = False,
    log_level: Annotated[str | None, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = None,
) -> None:
    """Start the gateway in the foreground (graceful shutdown on SIGTERM or Ctrl-C)."""
    root_state_dir = global_options(ctx).state_dir
    chosen_state_dir = state_dir if state_dir is not None else root_state_dir
    overrides: dict[str, Any] = {
        "state_dir": chosen_state_dir.resolve() if chosen_state_dir is not None else None,
        "listen_tcp": listen_tcp,
        "http_port": http_port,
        "driver": driver.value if driver is not None else None,
        "local.pools_dir": pools.resolve() if pools is not None else None,
        # Only an explicit flag overrides the config file; the default leaves it alone.
        "local.allow_unisolated": True if allow_unisolated else None,
        "log_level": log_level.upper() if log_level else None,
    }
    raise typer.Exit(_run(config_file, overrides))


def _run(config_file: Path | None, overrides: dict[str, Any]) -> int:
    import asyncio

    from warmshell.cli import client
    from warmshell.cli.errors import CliError, ExitCode, exit_code_for
    from warmshell.core import config, errors

    try:
        gateway_config = config.load_config(config_file, overrides)
        from warmshell.gateway import server

        asyncio.run(server.serve(gateway_config))
    except errors.WarmshellError as exc:
        failure = CliError(str(exc), exit_code_for(exc))
        client.report(failure)
        return int(failure.code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    return 0
