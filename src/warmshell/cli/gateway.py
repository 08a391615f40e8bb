"""`warmshell gateway start`: build the gateway's configuration from a file and flags, then run
it in the foreground until SIGTERM or SIGINT; `warmshell gateway wait`: block until one answers."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from warmshell.cli.options import (
    Parser,
    Subcommands,
    add_connection_options,
    bounded_float,
    bounded_int,
    global_options,
    usage_error,
)

__all__ = ["register"]

DRIVERS = ("local", "kubernetes")
LOG_LEVELS = ("debug", "info", "warning", "error")


def register(commands: Any, *, chosen: str | None) -> None:
    """Add `gateway` to the root parser's subcommands, with the flags of the `chosen` one."""
    sub = Subcommands(commands, "gateway", "run the gateway", chosen=chosen)
    start = sub.add("start", _start, "Start the gateway in the foreground (graceful shutdown on SIGTERM or Ctrl-C).")
    if start is not None:
        _start_flags(start)
    wait = sub.add(
        "wait",
        _wait,
        "Wait until the gateway answers requests, for scripts that start one in the background. "
        "Fails (exit 69) as soon as the --pid process is gone, or (exit 124) after --timeout.",
    )
    if wait is not None:
        wait.add_argument(
            "--timeout", type=bounded_float(0), default=30.0, metavar="SECONDS", help="give up after this long (30)"
        )
        wait.add_argument("--pid", type=int, help="the gateway's process id (e.g. `$!`): fail at once if it exits")
        add_connection_options(wait)


def _start_flags(start: Parser) -> None:
    start.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="state directory: socket, token, database (env WARMSHELL_STATE_DIR; default $XDG_STATE_HOME/warmshell)",
    )
    start.add_argument("--config", type=Path, metavar="FILE", help="gateway config (TOML)")
    start.add_argument("--driver", choices=DRIVERS, help="compute driver (default: local)")
    start.add_argument("--pools", type=Path, metavar="DIR", help="directory of warm-pool profiles (local driver)")
    start.add_argument("--listen-tcp", metavar="HOST:PORT", help="also serve the API over TCP")
    start.add_argument(
        "--http-port",
        type=bounded_int(0, 65535),
        metavar="N",
        help="port of /healthz and /metrics; 0: any free port (env WARMSHELL_HTTP_PORT; default 9464)",
    )
    start.add_argument(
        "--allow-unisolated",
        action="store_true",
        help="run sandboxes as plain processes when bubblewrap is missing (no isolation)",
    )
    start.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        help="log level (default info); debug also shows tracebacks of start-up failures",
    )


def _start(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or getattr(args, "root_state_dir", None)
    http_port = args.http_port
    if http_port is None and os.environ.get("WARMSHELL_HTTP_PORT"):
        try:
            http_port = bounded_int(0, 65535)(os.environ["WARMSHELL_HTTP_PORT"])
        except argparse.ArgumentTypeError as exc:
            raise usage_error(f"WARMSHELL_HTTP_PORT: {exc}") from None
    overrides: dict[str, Any] = {
        "state_dir": state_dir.resolve() if state_dir is not None else None,
        "listen_tcp": args.listen_tcp,
        "http_port": http_port,
        "driver": args.driver,
        "local.pools_dir": args.pools.resolve() if args.pools is not None else None,
        # Only an explicit flag overrides the config file; the default leaves it alone.
        "local.allow_unisolated": True if args.allow_unisolated else None,
        "log_level": args.log_level.upper() if args.log_level else None,
    }
    return _run(args.config, overrides)


def _wait(args: argparse.Namespace) -> int:
    from warmshell.cli import client, waiting

    return client.run(lambda: waiting.wait_for_gateway(global_options(args), limit_seconds=args.timeout, pid=args.pid))


def _run(config_file: Path | None, overrides: dict[str, Any]) -> int:
    import asyncio

    from warmshell.cli import startup
    from warmshell.cli.errors import CliError, ExitCode, exit_code_for, report
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
    report(failure)
    return int(failure.code)
