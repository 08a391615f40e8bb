"""`warmshell sandbox ...`: create, list, get, exec, delete and watch sandboxes; cp and ls files;
ps and attach background commands (`cli.processes`).

`_COMMANDS` declares each subcommand and its flags once; `register` builds the parser of the one
chosen. Each handler builds its request (a create through the SDK's own builder) and hands a body
to `client.run`, which calls the gateway through the SDK client `client.connect` opens. Protobuf
and the renderers are imported inside the handlers, so parsing and `--help` never pay for them.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from warmshell.cli import snapshots
from warmshell.cli.errors import inert
from warmshell.cli.options import (
    Command,
    Subcommands,
    add_connection_options,
    add_output_option,
    bounded_float,
    bounded_int,
    flag,
    global_options,
    output_is_json,
    parse_pairs,
    parse_secrets,
    usage_error,
    workspace,
    workspace_flag,
)
from warmshell.core.apiranges import MAX_LIFETIME_SECONDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from warmshell.sdk import views
    from warmshell.sdk.client import Client

    _Body = Callable[[Client], int]

__all__ = ["register"]


def register(commands: Any, *, chosen: str | None) -> None:
    """Add `sandbox` to the root parser's subcommands, with the flags of the `chosen` one."""
    sub = Subcommands(commands, "sandbox", "create, inspect, run commands in and delete sandboxes", chosen=chosen)
    for command in _COMMANDS:
        parser = sub.add_command(command)
        if parser is not None:
            add_output_option(parser)
            add_connection_options(parser)


def _create(args: argparse.Namespace) -> int:
    from warmshell.cli import client, creating
    from warmshell.sdk import calls, views

    if args.rm and (args.detach or not args.command):
        raise usage_error("--rm needs a command (`-- CMD...`) and no --detach")
    request = calls.create_request(
        name=args.name,
        workspace=workspace(args),
        image=args.image,
        env=parse_pairs(args.env, flag="--env"),
        secrets=_secrets_for_hosts(parse_secrets(args.secret, args.secret_file), args.secret_hosts),
        network=views.Network(allow=tuple(args.allow_net), deny=tuple(args.deny_net)),
        cpu=args.cpu,
        memory=args.memory,
        pids=args.pids,
        command=args.command,
        no_command=args.no_command,
        labels=parse_pairs(args.label, flag="--label"),
        ttl_seconds=args.ttl,
        idle_timeout_seconds=args.idle_timeout,
    )
    human = not output_is_json(args)
    return client.run(
        lambda: creating.create(
            global_options(args), request, detach=args.detach, ready_timeout=args.timeout, human=human, remove=args.rm
        )
    )


def _secrets_for_hosts(secrets: dict[str, str], hosts: list[str]) -> dict[str, str | views.Secret]:
    """`--secret-hosts K=HOST,...` folded into the secret K (a usage error when there is none)."""
    from warmshell.sdk import views

    folded: dict[str, str | views.Secret] = dict(secrets)
    for name, text in parse_pairs(hosts, flag="--secret-hosts").items():
        if name not in secrets:
            raise usage_error(f"--secret-hosts: {name}: there is no --secret or --secret-file named {name}")
        folded[name] = views.Secret(secrets[name], hosts=tuple(host for host in text.split(",") if host))
    return folded


def _list(args: argparse.Namespace) -> int:
    from warmshell.api.v1 import sandbox_pb2

    request = sandbox_pb2.ListSandboxesRequest(
        workspace=workspace(args), all_workspaces=args.all_workspaces, label_selector=args.selector
    )
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        from warmshell.cli import render

        response = sdk.service.list_sandboxes(request)
        if as_json:
            print(render.to_json(response))
        else:
            print(inert(render.sandbox_table(response.sandboxes, now_ms=time.time_ns() // 1_000_000), limit=None))
        return 0

    return _with_connection(args, body)


def _get(args: argparse.Namespace) -> int:
    from warmshell.api.v1 import sandbox_pb2

    ref = sandbox_pb2.SandboxRef(name=args.name, workspace=workspace(args))
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        from warmshell.cli import render

        found = sdk.service.get_sandbox(ref)
        print(render.to_json(found) if as_json else inert(render.sandbox_details(found), limit=None))
        return 0

    return _with_connection(args, body)


def _egress(args: argparse.Namespace) -> int:
    from warmshell.api.v1 import sandbox_pb2

    ref = sandbox_pb2.SandboxRef(name=args.name, workspace=workspace(args))
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        from warmshell.cli import render

        found = sdk.service.list_egress(ref)
        print(render.to_json(found) if as_json else inert(render.egress_table(found), limit=None))
        return 0

    return _with_connection(args, body)


def _exec(args: argparse.Namespace) -> int:
    if not args.command:
        raise usage_error("sandbox exec: the command to run goes after `--` (e.g. `sandbox exec NAME -- ls`)")
    if args.background:
        from warmshell.cli import processes

        return processes.start(args)
    if (args.stdin or args.tty) and not output_is_json(args):
        from warmshell.cli import interactive

        return interactive.run(args)
    from warmshell.api.v1 import sandbox_pb2

    request = sandbox_pb2.ExecSandboxRequest(
        name=args.name,
        workspace=workspace(args),
        command=args.command,
        environment=parse_pairs(args.env, flag="--env"),
        workdir=args.workdir,
        timeout_seconds=args.timeout,
        stdin=sys.stdin.buffer.read() if args.stdin else b"",
    )
    capture = output_is_json(args)

    def body(sdk: Client) -> int:
        import json

        from warmshell.cli import streaming
        from warmshell.sdk import calls

        result = streaming.exec_command(sdk, request, capture=capture, timeout=calls.exec_deadline(args.timeout))
        assert result.exit_code is not None
        if capture:
            document = {
                "exit_code": result.exit_code,
                "stdout": result.stdout.decode(errors="replace"),
                "stderr": result.stderr.decode(errors="replace"),
                "timed_out": result.outcome.timed_out,
                "signal": result.outcome.signal,
                "error": result.outcome.error.value if result.outcome.error is not None else None,
                "error_message": result.outcome.error_message,
            }
            print(json.dumps(document, indent=2, sort_keys=True))
        elif line := streaming.outcome_line(result.outcome, args.timeout):
            print(line, file=sys.stderr)
        return result.exit_code

    return _with_connection(args, body)


def _delete(args: argparse.Namespace) -> int:
    from warmshell.api.v1 import sandbox_pb2

    ref = sandbox_pb2.SandboxRef(name=args.name, workspace=workspace(args))
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        from warmshell.cli import render

        response = sdk.service.delete_sandbox(ref)
        if as_json:
            print(render.to_json(response))
        else:
            name = args.name
            print(f"sandbox {name} deleted" if response.deleted else f"sandbox {name} is already being deleted")
        return 0

    return _with_connection(args, body)


def _watch(args: argparse.Namespace) -> int:
    from warmshell.api.v1 import sandbox_pb2

    request = sandbox_pb2.WatchSandboxRequest(name=args.name, workspace=workspace(args), stop_on_terminal=True)
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        import json

        from warmshell.cli import render

        last_phase: int | None = None
        for event in sdk.service.watch_sandbox(request, timeout=None):
            if as_json:
                print(json.dumps(render.to_dict(event), sort_keys=True), flush=True)
                continue
            # Every line is stamped when it arrives, on one clock, so the lines are in time order
            # (the event's own gateway time is in `-o json`).
            now_ms = time.time_ns() // 1_000_000
            kind = event.WhichOneof("event")
            if kind == "sandbox" and event.sandbox.status.phase != last_phase:
                last_phase = event.sandbox.status.phase
                print(inert(render.phase_line(event.sandbox, now_ms=now_ms), limit=None), flush=True)
            elif kind == "progress":
                print(inert(render.progress_line(event.progress, now_ms=now_ms), limit=None), flush=True)
            elif kind == "deleted":
                print(f"{render.clock(now_ms)}  sandbox {args.name} deleted", flush=True)
        return 0

    return _with_connection(args, body)


def _cp(args: argparse.Namespace) -> int:
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        import json

        from warmshell.cli import files

        if args.recursive:
            where, entries, size = files.copy_tree(sdk, args.source, args.destination, workspace(args))
            if as_json:
                print(json.dumps({"destination": where, "entries": entries, "bytes": size}, sort_keys=True))
            return 0
        where, size = files.copy(sdk, args.source, args.destination, workspace(args))
        if as_json:
            print(json.dumps({"destination": where, "bytes": size}, sort_keys=True))
        return 0

    return _with_connection(args, body)


def _ls(args: argparse.Namespace) -> int:
    as_json = output_is_json(args)

    def body(sdk: Client) -> int:
        import dataclasses
        import json

        from warmshell.cli import files

        entries = files.list_files(sdk, args.name, args.path, workspace(args))
        if as_json:
            print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2, sort_keys=True))
        else:
            print(inert(files.listing_table(entries, now_ms=time.time_ns() // 1_000_000), limit=None))
        return 0

    return _with_connection(args, body)


def _ps(args: argparse.Namespace) -> int:
    from warmshell.cli import processes

    return processes.ps(args)


def _attach(args: argparse.Namespace) -> int:
    from warmshell.cli import processes

    return processes.attach(args)


def _with_connection(args: argparse.Namespace, body: _Body) -> int:
    from warmshell.cli import client

    return client.run_connected(global_options(args), body)


_NAME = flag("name", metavar="NAME", help="sandbox name")
_WORKSPACE = workspace_flag("sandbox")
_ENV = flag("-e", "--env", action="append", default=[], metavar="K=V", help="environment variable")
_LIFETIME = bounded_int(0, MAX_LIFETIME_SECONDS)

# Every subcommand and its flags, in the order `--help` shows them.
_COMMANDS = (
    Command(
        "create",
        _create,
        "Create a sandbox and wait until it is Ready; with `-- CMD...`, stream the command's output "
        "and exit with its exit code.",
        usage="%(prog)s [options] [-- CMD...]",
        accepts_command=True,
        flags=(
            flag("--name", default="", help="name (DNS-1123 label); generated when empty"),
            flag("--image", default="", help="image; empty selects the driver's default"),
            _ENV,
            flag(
                "--secret",
                action="append",
                default=[],
                metavar="K=V",
                help="secret environment variable: never part of the pool match, never shown (repeatable)",
            ),
            flag(
                "--secret-file",
                action="append",
                default=[],
                metavar="K=PATH",
                help="secret read from a file, so it is not in shell history (one trailing newline dropped)",
            ),
            flag(
                "--secret-hosts",
                action="append",
                default=[],
                metavar="K=HOST,...",
                help="the secret K is for these hosts only (HOST?: in URLs too); the workload sees a placeholder",
            ),
            flag(
                "--allow-net",
                action="append",
                default=[],
                metavar="HOST[:PORT]",
                help="egress allowed (also *.DOMAIN[:PORT], an IP, a CIDR); narrows the profile's (repeatable)",
            ),
            flag("--deny-net", action="append", default=[], metavar="HOST[:PORT]", help="egress denied (repeatable)"),
            flag("--cpu", default="", help="CPU (Kubernetes quantity, e.g. 0.5 or 500m)"),
            flag("--memory", default="", help="memory (Kubernetes quantity, e.g. 256Mi)"),
            flag(
                "--pids",
                type=bounded_int(0, 2**31 - 1),
                default=0,
                metavar="N",
                help="most processes at once (default: the gateway's)",
            ),
            _WORKSPACE,
            flag("-l", "--label", action="append", default=[], metavar="K=V", help="label (repeatable)"),
            flag("-d", "--detach", action="store_true", help="return once created, without waiting"),
            flag(
                "--timeout",
                type=bounded_float(0),
                metavar="SECONDS",
                help="seconds to wait for Ready (default: no limit)",
            ),
            flag(
                "--ttl", type=_LIFETIME, metavar="SECONDS", help="delete after N s (default: the gateway's; 0: never)"
            ),
            flag(
                "--idle-timeout", type=_LIFETIME, metavar="SECONDS", help="delete after N s without an exec (0: never)"
            ),
            flag("--rm", action="store_true", help="delete it once its command's output is delivered"),
            flag(
                "--no-command",
                action="store_true",
                help="run nothing, not even the image's Entrypoint/Cmd: the sandbox idles for exec",
            ),
        ),
    ),
    Command(
        "list",
        _list,
        "List sandboxes.",
        flags=(
            workspace_flag("sandboxes"),
            flag("-A", "--all-workspaces", action="store_true", help="list every workspace"),
            flag("-l", "--selector", default="", metavar="K=V,...", help="label selector (all must match)"),
        ),
    ),
    Command(
        "get",
        _get,
        "Show one sandbox: phase, conditions, allocation, exit code, labels, timeline.",
        (_NAME, _WORKSPACE),
    ),
    Command(
        "exec",
        _exec,
        "Run a command in a Ready sandbox, stream its output and exit with its exit code. "
        'With -o json the output is collected and printed as {"exit_code", "stdout", "stderr"}.',
        usage="%(prog)s NAME [options] -- CMD...",
        accepts_command=True,
        flags=(
            _NAME,
            _WORKSPACE,
            _ENV,
            flag("--workdir", default="", metavar="DIR", help="working directory inside the sandbox"),
            flag(
                "--timeout",
                type=bounded_int(0, 2**31 - 1),
                default=0,
                metavar="SECONDS",
                help="kill it after N s (0: none)",
            ),
            flag("-i", "--stdin", action="store_true", help="stream stdin to it"),
            flag("-t", "--tty", action="store_true", help="run it on a terminal in the sandbox (with -i)"),
            flag(
                "-b",
                "--background",
                action="store_true",
                help="start it in the background, print its pid and return (see `sandbox ps`, `sandbox attach`)",
            ),
        ),
    ),
    Command("ps", _ps, "List the sandbox's background commands, running and recently exited.", (_NAME, _WORKSPACE)),
    Command(
        "attach",
        _attach,
        "Reattach to a background command: the output the gateway kept, then live output; exits with its "
        "exit status. Ctrl-C detaches (it runs on); with -i, stdin is streamed to it and Ctrl-C sent to it.",
        flags=(
            _NAME,
            flag("pid", type=bounded_int(1, 2**32 - 1), metavar="PID", help="its pid (from `sandbox ps`)"),
            _WORKSPACE,
            flag("-i", "--stdin", action="store_true", help="stream stdin to it"),
        ),
    ),
    Command(
        "egress",
        _egress,
        "List the sandbox's latest egress decisions (time, host, port, verdict and rule, bytes up and "
        "down): a bounded log the gateway keeps while the sandbox lives.",
        (_NAME, _WORKSPACE),
    ),
    Command(
        "delete", _delete, "Delete a sandbox (its processes are stopped and its record removed).", (_NAME, _WORKSPACE)
    ),
    Command(
        "cp",
        _cp,
        "Copy one file into a sandbox (`cp LOCAL NAME:PATH`) or out of it (`cp NAME:PATH LOCAL`). "
        "A relative PATH is under /workspace; a PATH ending in / keeps the local file's name. "
        "Parents are created; the file is replaced atomically. With -r, a directory in one call "
        "(modes, symbolic links and mtimes kept), into DESTINATION when it is an existing directory.",
        flags=(
            flag("source", metavar="SOURCE", help="LOCAL or NAME:PATH"),
            flag("destination", metavar="DESTINATION", help="NAME:PATH or LOCAL"),
            flag("-r", "--recursive", action="store_true", help="copy a directory and everything in it"),
            _WORKSPACE,
        ),
    ),
    Command(
        "ls",
        _ls,
        "List a directory in a sandbox. PATH defaults to /workspace; relative paths are under it.",
        flags=(
            _NAME,
            _WORKSPACE,
            flag("path", metavar="PATH", nargs="?", default="/workspace", help="directory (default /workspace)"),
        ),
    ),
    Command(
        "snapshot",
        snapshots.snapshot,
        "Capture a Ready sandbox of an image as an image of the local image store: what it wrote over "
        "its image and its /workspace (not /tmp, /run, or its processes' memory). It is frozen "
        "meanwhile and keeps running. Prints the image pinned to its digest.",
        flags=(
            _NAME,
            _WORKSPACE,
            flag("--as", dest="image", required=True, metavar="IMAGE:TAG", help="the snapshot's name and tag"),
            flag("--force", action="store_true", help="move the tag if it names an image already"),
        ),
    ),
    Command(
        "fork",
        snapshots.fork,
        "Make COUNT new sandboxes from one snapshot of a Ready sandbox of an image: each starts from "
        "its files as they are now (not its processes' memory: each runs its command afresh), with "
        "its spec, a /workspace of its own (copy-on-write, no copy), and its own name, id and token. "
        "Children are PREFIX-1 .. PREFIX-COUNT (default NAME-fork). Exits 1 if a child failed.",
        flags=(
            _NAME,
            _WORKSPACE,
            flag("--count", type=bounded_int(1, 1000), required=True, metavar="N", help="how many children"),
            flag("--prefix", default="", metavar="P", help="children are P-1 .. P-N (default NAME-fork)"),
            flag("--with-secrets", action="store_true", help="give the children the parent's secrets too"),
            flag("--ready-timeout", type=float, default=120.0, metavar="SECONDS", help="wait for Ready (default 120)"),
        ),
    ),
    Command(
        "pause",
        snapshots.pause,
        "Pause a Ready sandbox of an image: its files (what it wrote over its image, and /workspace) "
        "are kept as an image, and every process, its memory and its runtime go; it stays, Paused, "
        "until resumed, deleted, or its pause TTL passes. On Kubernetes its Sandbox is suspended "
        "instead: the pod is deleted, /workspace is kept only on a volume claim "
        "(kubernetes.workspace_claim_size).",
        flags=(
            _NAME,
            _WORKSPACE,
            flag(
                "--pause-ttl",
                type=bounded_int(0, 2**31 - 1),
                default=0,
                metavar="SECONDS",
                help="delete it if not resumed within N s (0: the gateway's default)",
            ),
        ),
    ),
    Command(
        "resume",
        snapshots.resume,
        "Start a Paused sandbox again from its files (its command re-run) and wait until it is Ready.",
        flags=(
            _NAME,
            _WORKSPACE,
            flag("--ready-timeout", type=float, default=120.0, metavar="SECONDS", help="wait for Ready (default 120)"),
        ),
    ),
    Command(
        "watch",
        _watch,
        "Print phase transitions and progress until the sandbox ends (Error or deleted) or Ctrl-C. "
        "With -o json, one JSON event per line.",
        (_NAME, _WORKSPACE),
    ),
)
