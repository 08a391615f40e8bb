"""`warmshell sandbox exec --background`, `sandbox ps` and `sandbox attach`: background commands,
which run until they exit whoever is connected.

`exec -b` starts one and prints its pid; `ps` lists a sandbox's running and recently exited ones;
`attach` prints the output the gateway kept (saying on stderr how much its ring dropped), then
live output, and exits with the command's exit status. Ctrl-C detaches and leaves the command
running; with `-i` stdin is streamed to it and Ctrl-C is sent to it instead (as `exec -i` does).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from warmshell.cli.errors import inert
from warmshell.cli.options import global_options, output_is_json, parse_pairs, workspace

if TYPE_CHECKING:
    from collections.abc import Callable

    from warmshell.api.v1 import sandbox_pb2
    from warmshell.sdk.client import Client
    from warmshell.sdk.interactive import Process

__all__ = ["attach", "process_table", "ps", "start"]


def _connected(args: argparse.Namespace, body: Callable[[Client], int]) -> int:
    from warmshell.cli import client

    return client.run_connected(global_options(args), body)


def start(args: argparse.Namespace) -> int:
    """`sandbox exec -b NAME -- CMD`: start it in the background and print its pid."""
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        sandbox = sdk.get(args.name, workspace=workspace(args))
        process = sandbox.start(
            args.command,
            env=parse_pairs(args.env, flag="--env"),
            workdir=args.workdir or None,
            timeout=args.timeout or None,
            background=True,
        )
        process.close()  # detach: it runs on
        print(f'{{"pid": {process.pid}}}' if as_json else process.pid)
        return 0

    return _connected(args, body)


def ps(args: argparse.Namespace) -> int:
    """`sandbox ps NAME`: its background commands."""
    from warmshell.api.v1 import sandbox_pb2

    ref = sandbox_pb2.SandboxRef(name=args.name, workspace=workspace(args))
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        from warmshell.cli import render

        response = sdk.service.list_processes(ref)
        now_ms = time.time_ns() // 1_000_000
        print(render.to_json(response) if as_json else inert(process_table(response, now_ms=now_ms), limit=None))
        return 0

    return _connected(args, body)


def process_table(response: sandbox_pb2.ListProcessesResponse, *, now_ms: int) -> str:
    """One row per command: pid, state, exit, age, output (and dropped) bytes, command line."""
    from warmshell.cli import render

    rows = []
    for p in response.processes:
        running = p.state == "running"
        ended = "" if running else (p.error or str(p.exit_code))
        output = f"{p.output_bytes}" + (f" ({p.dropped_bytes} dropped)" if p.dropped_bytes else "")
        age = render.format_age(p.started_at_ms, now_ms)
        rows.append((str(p.pid), p.state, ended, age, output, " ".join(p.command)))
    return render.table(("PID", "STATE", "EXIT", "AGE", "OUTPUT", "COMMAND"), rows, right=frozenset({0}))


def attach(args: argparse.Namespace) -> int:
    """`sandbox attach NAME PID [-i]`: its output, kept then live, and its exit status."""

    def body(sdk: Client) -> int:
        sandbox = sdk.get(args.name, workspace=workspace(args))
        process = sandbox.connect(args.pid)
        if args.stdin:
            from warmshell.cli import interactive

            return interactive.relay_session(process, sys.stdin.fileno(), on_terminal=False)
        try:
            return _follow(process)
        except KeyboardInterrupt:
            print(f"warmshell: detached; background command {args.pid} runs on", file=sys.stderr)
            return 130
        finally:
            process.close()

    return _connected(args, body)


def _follow(process: Process) -> int:
    """Copy the command's output here until it exits; its exit status."""
    for event in process:
        if event.dropped_bytes:
            print(f"warmshell: {event.dropped_bytes} bytes of earlier output were dropped", file=sys.stderr)
        for data, stream in ((event.stdout, sys.stdout.buffer), (event.stderr, sys.stderr.buffer)):
            if data:
                stream.write(data)
                stream.flush()
    assert process.exit_code is not None
    return process.exit_code
