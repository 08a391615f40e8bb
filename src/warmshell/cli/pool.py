"""`warmshell pool list`: the warm pools the gateway keeps, with their hit rates."""

from __future__ import annotations

from typing import Annotated

import typer

from warmshell.cli.options import (
    Gateway,
    Output,
    OutputFormat,
    StateDir,
    Token,
    Workspace,
    global_options,
)

__all__ = ["app"]

app = typer.Typer(help="Inspect warm pools.", no_args_is_help=True)


@app.command("list")
def list_(
    ctx: typer.Context,
    workspace: Workspace = "",
    all_workspaces: Annotated[bool, typer.Option("--all-workspaces", "-A", help="List every workspace.")] = False,
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """List warm pools: fingerprint, desired/ready/idle members, hits, misses and hit rate."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    request = sandbox_pb2.ListPoolsRequest(workspace=workspace, all_workspaces=all_workspaces)

    async def body() -> int:
        from warmshell.cli import render

        async with client.connect(options) as conn:
            response = await conn.stub.ListPools(request, metadata=conn.metadata, timeout=client.UNARY_TIMEOUT_SECONDS)
        if output is OutputFormat.JSON:
            print(render.to_json(response))
        else:
            render.show(render.pools_view(response))
        return 0

    client.run(body())
