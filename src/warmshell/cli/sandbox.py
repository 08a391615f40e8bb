"""`warmshell sandbox ...`: create, list, get, exec, delete and watch sandboxes.

Each command parses its flags here and hands an async body to `client.run`; grpc, protobuf and
the rendering code are imported inside the bodies so `--help` stays fast.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from warmshell.cli.options import (
    Gateway,
    GlobalOptions,
    Output,
    OutputFormat,
    StateDir,
    Token,
    Workspace,
    global_options,
    parse_pairs,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from warmshell.cli.client import Connection

    _Body = Callable[[Connection], Awaitable[int]]

__all__ = ["app"]

app = typer.Typer(help="Create, inspect, run commands in and delete sandboxes.", no_args_is_help=True)

Command = Annotated[list[str] | None, typer.Argument(help="Command (argv) after `--`.")]
Name = Annotated[str, typer.Argument(help="Sandbox name.")]


@app.command()
def create(
    ctx: typer.Context,
    command: Command = None,
    name: Annotated[str, typer.Option(help="Name (DNS-1123 label); generated when empty.")] = "",
    image: Annotated[str, typer.Option(help="Image; empty selects the driver's default.")] = "",
    env: Annotated[list[str] | None, typer.Option("--env", "-e", metavar="K=V", help="Environment variable.")] = None,
    cpu: Annotated[str, typer.Option(help="CPU (Kubernetes quantity, e.g. 0.5 or 500m).")] = "",
    memory: Annotated[str, typer.Option(help="Memory (Kubernetes quantity, e.g. 256Mi).")] = "",
    workspace: Workspace = "",
    label: Annotated[list[str] | None, typer.Option("--label", "-l", metavar="K=V", help="Label.")] = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once created.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for Ready (default: no limit).", min=0)] = None,
    ttl: Annotated[
        int | None, typer.Option("--ttl", help="Delete after N seconds (default: the gateway's; 0: never).", min=0)
    ] = None,
    idle_timeout: Annotated[
        int | None, typer.Option(help="Delete after N seconds without an exec (0: never).", min=0)
    ] = None,
    rm: Annotated[
        bool, typer.Option("--rm", help="Delete the sandbox once its command's output is delivered.")
    ] = False,
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """Create a sandbox and wait until it is Ready; with `-- CMD...`, stream the command's
    output and exit with its exit code (and with `--rm`, delete it then)."""
    if rm and (detach or not command):
        raise typer.BadParameter("needs a command (`-- CMD...`) and no --detach", param_hint="--rm")
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    request = sandbox_pb2.CreateSandboxRequest(
        name=name,
        workspace=workspace,
        labels=parse_pairs(label or [], flag="--label"),
        spec=sandbox_pb2.SandboxSpec(
            image=image,
            environment=parse_pairs(env or [], flag="--env"),
            resources=sandbox_pb2.Resources(cpu=cpu, memory=memory),
            command=command or [],
        ),
    )
    if ttl is not None:
        request.ttl_seconds = ttl
    if idle_timeout is not None:
        request.idle_timeout_seconds = idle_timeout
    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    from warmshell.cli import creating

    human = output is OutputFormat.HUMAN
    client.run(creating.create(options, request, detach=detach, ready_timeout=timeout, human=human, remove=rm))


@app.command("list")
def list_(
    ctx: typer.Context,
    workspace: Workspace = "",
    all_workspaces: Annotated[bool, typer.Option("--all-workspaces", "-A", help="List every workspace.")] = False,
    selector: Annotated[
        str, typer.Option("--selector", "-l", help="Label selector k1=v1,k2=v2 (all must match).")
    ] = "",
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """List sandboxes."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    request = sandbox_pb2.ListSandboxesRequest(
        workspace=workspace, all_workspaces=all_workspaces, label_selector=selector
    )

    async def body(conn: Connection) -> int:
        from warmshell.cli import render

        response = await conn.stub.ListSandboxes(request, metadata=conn.metadata, timeout=client.UNARY_TIMEOUT_SECONDS)
        if output is OutputFormat.JSON:
            print(render.to_json(response))
        else:
            now_ms = time.time_ns() // 1_000_000
            render.show(render.sandbox_table(response.sandboxes, now_ms=now_ms))
        return 0

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    client.run(_with_connection(options, body))


@app.command()
def get(
    ctx: typer.Context,
    name: Name,
    workspace: Workspace = "",
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """Show one sandbox: phase, conditions, allocation, exit code, labels, resources, timeline."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    async def body(conn: Connection) -> int:
        from warmshell.cli import render

        sandbox = await conn.stub.GetSandbox(
            sandbox_pb2.SandboxRef(name=name, workspace=workspace),
            metadata=conn.metadata,
            timeout=client.UNARY_TIMEOUT_SECONDS,
        )
        if output is OutputFormat.JSON:
            print(render.to_json(sandbox))
        else:
            render.show(render.sandbox_details(sandbox))
        return 0

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    client.run(_with_connection(options, body))


@app.command("exec")
def exec_(
    ctx: typer.Context,
    name: Name,
    command: Annotated[list[str], typer.Argument(help="Command (argv) after `--`.")],
    workspace: Workspace = "",
    env: Annotated[list[str] | None, typer.Option("--env", "-e", metavar="K=V", help="Environment variable.")] = None,
    workdir: Annotated[str, typer.Option(help="Working directory inside the sandbox.")] = "",
    timeout: Annotated[int, typer.Option(help="Kill the command after N seconds (0: none).", min=0)] = 0,
    stdin: Annotated[bool, typer.Option("--stdin", "-i", help="Send all of stdin to it.")] = False,
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """Run a command in a Ready sandbox, stream its output and exit with its exit code.

    With `-o json` the output is collected and printed as {"exit_code", "stdout", "stderr"}.
    """
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    request = sandbox_pb2.ExecSandboxRequest(
        name=name,
        workspace=workspace,
        command=command,
        environment=parse_pairs(env or [], flag="--env"),
        workdir=workdir,
        timeout_seconds=timeout,
        stdin=sys.stdin.buffer.read() if stdin else b"",
    )

    async def body(conn: Connection) -> int:
        from warmshell.cli import streaming

        capture = output is OutputFormat.JSON
        result = await streaming.exec_command(conn, request, capture=capture)
        assert result.exit_code is not None
        if capture:
            document = {
                "exit_code": result.exit_code,
                "stdout": result.stdout.decode(errors="replace"),
                "stderr": result.stderr.decode(errors="replace"),
            }
            print(json.dumps(document, indent=2, sort_keys=True))
        return result.exit_code

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    client.run(_with_connection(options, body))


@app.command()
def delete(
    ctx: typer.Context,
    name: Name,
    workspace: Workspace = "",
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """Delete a sandbox (its processes are stopped and its record removed)."""
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    async def body(conn: Connection) -> int:
        from warmshell.cli import render

        response = await conn.stub.DeleteSandbox(
            sandbox_pb2.SandboxRef(name=name, workspace=workspace),
            metadata=conn.metadata,
            timeout=client.UNARY_TIMEOUT_SECONDS,
        )
        if output is OutputFormat.JSON:
            print(render.to_json(response))
        else:
            print(f"sandbox {name} deleted" if response.deleted else f"sandbox {name} is already being deleted")
        return 0

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    client.run(_with_connection(options, body))


@app.command()
def watch(
    ctx: typer.Context,
    name: Name,
    workspace: Workspace = "",
    output: Output = OutputFormat.HUMAN,
    state_dir: StateDir = None,
    gateway: Gateway = None,
    token: Token = None,
) -> None:
    """Print phase transitions and progress until the sandbox ends (Error or deleted) or Ctrl-C.

    With `-o json`, one JSON event per line.
    """
    from warmshell.api.v1 import sandbox_pb2
    from warmshell.cli import client

    request = sandbox_pb2.WatchSandboxRequest(name=name, workspace=workspace, stop_on_terminal=True)

    async def body(conn: Connection) -> int:
        from warmshell.cli import render

        last_phase: int | None = None
        async for event in conn.stub.WatchSandbox(request, metadata=conn.metadata):
            if output is OutputFormat.JSON:
                print(json.dumps(render.to_dict(event), sort_keys=True), flush=True)
                continue
            kind = event.WhichOneof("event")
            if kind == "sandbox" and event.sandbox.status.phase != last_phase:
                last_phase = event.sandbox.status.phase
                now_ms = time.time_ns() // 1_000_000
                print(render.phase_line(event.sandbox, now_ms=now_ms), flush=True)
            elif kind == "progress":
                print(render.progress_line(event.progress), flush=True)
            elif kind == "deleted":
                print(f"sandbox {name} deleted", flush=True)
        return 0

    options = global_options(ctx, state_dir=state_dir, gateway=gateway, token=token)
    client.run(_with_connection(options, body))


async def _with_connection(options: GlobalOptions, body: _Body) -> int:
    from warmshell.cli import client

    async with client.connect(options) as conn:
        return await body(conn)
