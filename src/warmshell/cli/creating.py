"""`warmshell sandbox create`, after the flags are parsed: create the sandbox, follow it with a
live status line to Ready (or, with a command, stream the workload until it exits), and decide
the exit code.
"""

from __future__ import annotations

import sys

from warmshell.api.v1 import sandbox_pb2
from warmshell.cli import client, render, streaming
from warmshell.cli.errors import CliError, ExitCode, inert
from warmshell.cli.options import GlobalOptions
from warmshell.sdk import calls, errors, following

__all__ = ["create"]


def create(
    options: GlobalOptions,
    request: sandbox_pb2.CreateSandboxRequest,
    *,
    detach: bool,
    ready_timeout: float | None,
    human: bool,
    remove: bool = False,
) -> int:
    """Create, then (unless `detach`) follow the sandbox to Ready or, with a command, to its
    exit; returns the exit code of `warmshell sandbox create`. With `remove` (`--rm`) the
    sandbox is deleted once the followed command's output has been delivered."""
    has_command = bool(request.spec.command)
    with client.connect(options) as sdk:
        created = sdk.service.create_sandbox(request)
        if detach:
            _print_created(created, human=human)
            return 0
        fold = calls.WatchFold(created, until_exit=has_command, follow_output=has_command and human)
        with streaming.StatusLine(created.name, enabled=human) as status:
            try:
                following.follow(sdk.service, fold, timeout=ready_timeout, on_event=status.show)
            except errors.DeadlineExceeded:
                raise CliError(
                    f"sandbox {created.name} was not Ready within {ready_timeout:g} s "
                    "(it was left in place; see `warmshell sandbox get`)",
                    ExitCode.TIMEOUT,
                ) from None
            except KeyboardInterrupt:
                # Ctrl-C: the sandbox lives on, say which.
                status.stop()
                print(f"\ninterrupted; sandbox {created.name} was left in place", file=sys.stderr)
                raise
        _check_not_gone(fold)
        if remove:
            sdk.service.delete_sandbox(sandbox_pb2.SandboxRef(name=created.name, workspace=created.workspace))
    return _create_outcome(fold.last, has_command=has_command, human=human)


def _check_not_gone(fold: calls.WatchFold) -> None:
    if fold.deleted:
        raise CliError(f"sandbox {fold.last.name} was deleted", ExitCode.SANDBOX_FAILED)
    if fold.last.status.phase == sandbox_pb2.SANDBOX_PHASE_DELETING:
        raise CliError(f"sandbox {fold.last.name} is being deleted", ExitCode.SANDBOX_FAILED)


def _print_created(sandbox: sandbox_pb2.Sandbox, *, human: bool) -> None:
    if human:
        print(f"sandbox {sandbox.name} created in workspace {sandbox.workspace}")
    else:
        print(render.to_json(sandbox))


def _create_outcome(sandbox: sandbox_pb2.Sandbox, *, has_command: bool, human: bool) -> int:
    """The exit code of `create`: the workload's when it ran, else Ready → 0 and Error → 7."""
    if not human:
        print(render.to_json(sandbox))
    if sandbox.status.HasField("exit_code") and has_command:
        return sandbox.status.exit_code
    if sandbox.status.phase == sandbox_pb2.SANDBOX_PHASE_READY and not has_command:
        if human:
            print(inert(render.create_summary(sandbox), limit=None))
        return 0
    if sandbox.status.phase == sandbox_pb2.SANDBOX_PHASE_ERROR:
        reasons = "; ".join(render.condition_lines(sandbox)) or "no condition recorded"
        raise CliError(f"sandbox {sandbox.name} failed: {reasons}", ExitCode.SANDBOX_FAILED)
    phase = render.phase_name(sandbox.status.phase)
    raise CliError(f"the watch of sandbox {sandbox.name} ended while it was {phase}")
