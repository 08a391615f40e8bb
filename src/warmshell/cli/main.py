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
    69   gateway unreachable (EX_UNAVAILABLE)
    77   unauthenticated or permission denied (EX_NOPERM)
    124  timed out
    130  interrupted (Ctrl-C)

A command's own exit code can collide with these; `-o json` shows which it was.
"""

from __future__ import annotations

import typer

from warmshell.cli import gateway, pool, sandbox, store
from warmshell.cli.errors import EXIT_CODE_HELP
from warmshell.cli.options import Gateway, GlobalOptions, StateDir, Token

__all__ = ["app", "main"]

app = typer.Typer(
    name="warmshell",
    help="warmshell: sandboxes for AI agents, served from warm pools.",
    epilog=EXIT_CODE_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(gateway.app, name="gateway")
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(pool.app, name="pool")
app.add_typer(store.app, name="store")


@app.callback()
def _root(
    ctx: typer.Context,
    state_dir: StateDir = None,
    gateway_address: Gateway = None,
    token: Token = None,
) -> None:
    ctx.obj = GlobalOptions(state_dir=state_dir, gateway=gateway_address, token=token)


def main() -> None:
    """Console-script entry point."""
    app()
