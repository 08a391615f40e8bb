"""`warmshell sandbox snapshot`: a sandbox's filesystem captured as an image (the lifecycle
commands built on snapshots live here)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from warmshell.cli.options import global_options, output_is_json, workspace

__all__ = ["fork", "pause", "resume", "snapshot"]


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


def fork(args: argparse.Namespace) -> int:
    """Fork sandbox `args.name` `args.count` times; one line per child (or JSON); exit 1 when a
    child failed."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client, render

    request = sandbox_pb2.ForkSandboxRequest(
        name=args.name,
        workspace=workspace(args),
        count=args.count,
        prefix=args.prefix,
        with_secrets=args.with_secrets,
        ready_timeout_ms=int(args.ready_timeout * 1000),
    )
    as_json = output_is_json(args)

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            response = sdk.service.fork_sandbox(request, timeout=args.ready_timeout + 60)
        if as_json:
            print(render.to_json(response))
        else:
            print(f"snapshot {response.image_digest} (frozen {response.frozen_ms} ms)")
            for child in response.children:
                phase = sandbox_pb2.SandboxPhase.Name(child.sandbox.status.phase).removeprefix("SANDBOX_PHASE_")
                print(f"{child.name}  {child.error_code + ': ' + child.error if child.error_code else phase.title()}")
        ready = sandbox_pb2.SANDBOX_PHASE_READY
        return 0 if all(c.sandbox.status.phase == ready and not c.error_code for c in response.children) else 1

    return client.run(body)


def pause(args: argparse.Namespace) -> int:
    """Pause sandbox `args.name`: its files kept, everything of it stopped."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    request = sandbox_pb2.PauseSandboxRequest(
        name=args.name, workspace=workspace(args), pause_ttl_seconds=args.pause_ttl
    )

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            paused = sdk.service.pause_sandbox(request)
        print(f"sandbox {paused.name} paused")
        return 0

    return client.run(body)


def resume(args: argparse.Namespace) -> int:
    """Resume sandbox `args.name` and wait until it is Ready."""
    from warmshell.cli import client
    from warmshell.sdk import calls

    request = calls.resume_request(args.name, workspace(args), ready_timeout=args.ready_timeout)

    def body() -> int:
        with client.connect(global_options(args)) as sdk:
            resumed = calls.resumed(sdk.service.resume_sandbox(request, timeout=args.ready_timeout + 60))
        print(f"sandbox {resumed.name} resumed: Ready")
        return 0

    return client.run(body)
