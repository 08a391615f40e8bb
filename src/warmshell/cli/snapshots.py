"""`warmshell sandbox snapshot`: a sandbox's filesystem captured as an image (the lifecycle
commands built on snapshots live here)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from warmshell.cli.options import global_options, output_is_json, workspace

__all__ = ["snapshot"]


def snapshot(args: argparse.Namespace) -> int:
    """Snapshot sandbox `args.name` as `args.image`; prints the pinned reference (or JSON)."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client
    from warmshell.sdk import views

    as_json = output_is_json(args)
    request = sandbox_pb2.SnapshotSandboxRequest(
        name=args.name, workspace=workspace(args), image=args.image, force=args.force
    )

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            taken = views.snapshot_info(sdk.service.snapshot_sandbox(request))
        if as_json:
            print(json.dumps(dataclasses.asdict(taken) | {"pinned": taken.pinned}, indent=2, sort_keys=True))
        else:
            how = "flattened into 1 layer" if taken.flattened else f"{taken.layers} layers"
            print(f"{taken.pinned}  ({how}; {taken.layer_bytes} bytes added; frozen {taken.frozen_ms} ms)")
        return 0

    return client.run(body)
