"""`warmshell gateway start`: build the gateway's configuration from a file and flags, then run
it in the foreground until SIGTERM or SIGINT; `warmshell gateway wait`: block until one answers."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from warmshell.cli.options import Gateway, StateDir, Token, global_options

__all__ = ["app"]

app = typer.Typer(help="Run the gateway.", no_args_is_help=True)


class DriverName(StrEnum):
    """Compute drivers the gateway can run with."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


class LogLevel(StrEnum):
    """Gateway log levels (the log is JSON on stderr)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@app.command()
def start(
    ctx: typer.Context,
    state_dir: Annotated[Path | None, typer.Option(help="State directory (socket, token, database).")] = None,
    config_file: Annotated[Path | None, typer.Option("--config", help="Gateway config (TOML).", dir_okay=False)] = None,
    listen_tcp: Annotated[str | None, typer.Option(metavar="HOST:PORT", help="Also serve the API over TCP.")] = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            envvar="WARMSHELL_HTTP_PORT",
            help="Port of /healthz and /metrics (0: any free port; default 9464).",
            min=0,
            max=65535,
        ),
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
    log_level: Annotated[
        LogLevel | None,
        typer.Option(case_sensitive=False, help="Log level; debug also shows tracebacks of start-up failures."),
    ] = None,
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
        "log_level": log_level.value.upper() if log_level is not None else None,
    }
    raise typer.Exit(_run(config_file, overrides))


def _run(config_file: Path | None, overrides: dict[str, Any]) -> int:
    import asyncio

    from warmshell.cli import client, startup
    from warmshell.cli.errors import CliError, ExitCode, exit_code_for
    from warmshell.core import config, errors

    # A traceback helps whoever debugs warmshell, not whoever mistyped a port: only on request.
    debug = overrides.get("log_level") == "DEBUG"
    gateway_config: config.GatewayConfig | None = None
    cause: Exception
    try:
        gateway_config = config.load_config(config_file, overrides)
        debug = gateway_config.log_level.upper() == "DEBUG"
        startup.preflight(gateway_config)
        from warmshell.gateway import server

        asyncio.run(server.serve(gateway_config))
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    except errors.WarmshellError as exc:
        failure, cause = CliError(str(exc), exit_code_for(exc)), exc
    except startup.StartupError as exc:
        failure, cause = CliError(str(exc), ExitCode.FAILED_PRECONDITION), exc
    except Exception as exc:
        if debug:
            raise
        explained = startup.explain(exc, gateway_config) if gateway_config is not None else None
        if explained is not None:
            failure = CliError(explained, ExitCode.FAILED_PRECONDITION)
        else:
            failure = CliError(f"the gateway failed: {type(exc).__name__}: {exc} (--log-level debug shows where)")
        cause = exc
    else:
        return 0
    if debug:
        import traceback

        traceback.print_exception(cause)
    client.report(failure)
    return int(failure.code)


@app.command()
def wait(
    ctx: typer.Context,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.", min=0)] = 30.0,
    pid: Annotated[
        int | None,
        typer.Option(help="The gateway's process id (e.g. `$!`): fail at once if it exits first."),
    ] = None,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """Wait until the gateway answers requests: for scripts that start one in the background.

    Fails (exit 69) as soon as the `--pid` process is gone, or (exit 124) after `--timeout`.
    """
    from warmshell.cli import client, waiting

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    client.run(waiting.wait_for_gateway(options, limit_seconds=timeout, pid=pid))
