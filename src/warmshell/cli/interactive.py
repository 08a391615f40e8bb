"""`warmshell sandbox exec -i` and `-it`: a command with streamed stdin, on the SDK's `Process`.

`-t` runs it on a pseudo-terminal in the sandbox: the local terminal goes raw for the duration
(every key, Ctrl-C included, travels as input, so the sandbox's line discipline turns \\x03 into
SIGINT), SIGWINCH sends the new size, and the terminal is restored on every exit path, SIGTERM
and SIGHUP included (the CLI then exits 128 + the signal, the command stopped). Without
`-t`, stdin (a pipe, a file) is streamed as the command reads it, so `cat big | ... exec -i`
runs with flat memory; a SIGINT here is forwarded to the command's process group. The exit
status is the command's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmshell.sdk.client import Client
    from warmshell.sdk.interactive import Process

__all__ = ["exec_interactive", "relay_session", "run"]

READ_CHUNK = 64 * 1024


class _Ended(BaseException):
    """SIGTERM or SIGHUP on a terminal session: unwinds it like Ctrl-C does, so the command is
    stopped and the local terminal restored before the CLI exits with 128 + the signal."""

    def __init__(self, signo: int) -> None:
        super().__init__(signo)
        self.signo = signo


def _ended(signo: int, frame: FrameType | None) -> None:
    raise _Ended(signo)


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The local terminal in raw mode, restored however the block ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keys typed ahead are kept, and sent
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _feed(process: Process, fd: int) -> None:
    """Copy stdin into the command until EOF (a thread: reading blocks)."""
    from warmshell.sdk import errors

    try:
        while data := os.read(fd, READ_CHUNK):
            process.send(data)
        process.close_stdin()
    except (OSError, errors.Error):
        return


def run(args: argparse.Namespace) -> int:
    """The `sandbox exec -i/-t` command on the CLI's SDK client; a refused call exits as every
    other command does."""
    from warmshell.cli import client
    from warmshell.cli.options import global_options, parse_pairs, workspace

    env = parse_pairs(args.env, flag="--env")

    def connected() -> int:
        with client.connect(global_options(args)) as sdk:
            return exec_interactive(args, sdk, workspace(args), env)

    return client.run(connected)


def exec_interactive(args: argparse.Namespace, client: Client, workspace: str, env: dict[str, str]) -> int:
    """Run `args.command` in the sandbox with stdin streamed (`args.tty`: on a terminal); its
    exit status. SDK errors propagate for the caller to report."""
    stdin_fd = sys.stdin.fileno()
    on_terminal = bool(args.tty)
    if on_terminal and not os.isatty(stdin_fd):
        on_terminal = False
        print("warmshell: stdin is not a terminal; running without -t", file=sys.stderr)
    sandbox = client.get(args.name, workspace=workspace)
    if on_terminal:
        size = os.get_terminal_size(stdin_fd)
        term = os.environ.get("TERM", "xterm")
        process = sandbox.start(
            args.command,
            tty=True,
            rows=size.lines,
            columns=size.columns,
            env={"TERM": term, **env},
            workdir=args.workdir or None,
            timeout=args.timeout or None,
        )
    else:
        process = sandbox.start(args.command, env=env, workdir=args.workdir or None, timeout=args.timeout or None)
    try:
        code = relay_session(process, stdin_fd, on_terminal=on_terminal)
    except _Ended as ended:
        return 128 + ended.signo
    from warmshell.cli import streaming

    # After the session: the terminal is the user's again when the CLI says its own line.
    if process.outcome is not None and (line := streaming.outcome_line(process.outcome, args.timeout)):
        print(line, file=sys.stderr)
    return code


def relay_session(process: Process, stdin_fd: int, *, on_terminal: bool) -> int:
    """Relay stdin, signals and resizes to `process` and its output here until it exits; the
    process is closed (the command stopped; a background one detached from) and the terminal
    restored on every way out."""
    import warmshell

    stdout = sys.stdout.buffer
    with process, contextlib.ExitStack() as stack:
        previous: dict[int, Any] = {}
        if on_terminal:
            stack.enter_context(_raw(stdin_fd))

            def resized(signo: int, frame: FrameType | None) -> None:
                with contextlib.suppress(OSError, warmshell.Error):
                    now = os.get_terminal_size(stdin_fd)
                    process.resize(now.lines, now.columns)

            previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, resized)
            # Their default action would end the CLI at once, leaving the terminal raw.
            for ending in (signal.SIGTERM, signal.SIGHUP):
                previous[ending] = signal.signal(ending, _ended)
        else:

            def interrupted(signo: int, frame: FrameType | None) -> None:
                with contextlib.suppress(warmshell.Error):
                    process.signal(signo)

            for forwarded in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                previous[forwarded] = signal.signal(forwarded, interrupted)
        try:
            threading.Thread(target=_feed, args=(process, stdin_fd), daemon=True).start()
            for event in process:
                if event.stdout:
                    stdout.write(event.stdout)
                    stdout.flush()
                if event.stderr:
                    sys.stderr.buffer.write(event.stderr)
                    sys.stderr.buffer.flush()
        finally:
            for restored, handler in previous.items():
                signal.signal(restored, handler)
    assert process.exit_code is not None
    return process.exit_code
