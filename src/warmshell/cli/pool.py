"""`warmshell pool list`: the warm pools the gateway keeps, with their hit rates and problems."""

from __future__ import annotations

import argparse
from typing import Any

from warmshell.cli.errors import inert
from warmshell.cli.options import (
    Subcommands,
    add_connection_options,
    add_output_option,
    add_workspace_option,
    global_options,
    output_is_json,
    workspace,
)

__all__ = ["register"]


def register(commands: Any, *, chosen: str | None) -> None:
    """Add `pool` to the root parser's subcommands, with the flags of the `chosen` one."""
    sub = Subcommands(commands, "pool", "inspect warm pools", chosen=chosen)
    listing = sub.add(
        "list",
        _list,
        "List warm pools: fingerprint, desired/ready/idle members, hits, misses, hit rate, and the "
        "problems of invalid profiles and of pools that can never serve.",
    )
    if listing is not None:
        add_workspace_option(listing, what="pools to list")
        listing.add_argument("-A", "--all-workspaces", action="store_true", help="list every workspace")
        add_output_option(listing)
        add_connection_options(listing)


def _list(args: argparse.Namespace) -> int:
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    request = sandbox_pb2.ListPoolsRequest(workspace=workspace(args), all_workspaces=args.all_workspaces)
    as_json = output_is_json(args)

    def body() -> int:
        from warmshell.cli import render

        with client.connect(global_options(args)) as sdk:
            response = sdk.service.list_pools(request)
        print(render.to_json(response) if as_json else inert(render.pools_view(response), limit=None))
        return 0

    return client.run(body)
