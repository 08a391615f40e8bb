"""Images built from setup steps (`Client.build_image`, `warmshell image build`): a fresh sandbox of
the base image runs the steps in order (a shell command each, or local files copied in), their
output streamed to the caller; the first step that fails ends the build naming it, and the result
is a snapshot of the sandbox. The sandbox is deleted whatever happens.

Built from the public API (create, exec, files, snapshot, delete): a build is what a user would
type, so it is allowed exactly what that user is (the egress hosts it names narrow the sandbox's
network as a create's would)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warmshell.sdk import errors, views

if TYPE_CHECKING:
    from warmshell.sdk.client import Client, Sandbox

__all__ = ["BuildFailed", "Copy", "Run", "Step", "build", "parse_copy"]


@dataclass(frozen=True)
class Run:
    """Run `command` with /bin/sh -c in the build sandbox (in /workspace)."""

    command: str

    def describe(self) -> str:
        """How the step is named in output and errors."""
        return f"run {self.command!r}"


@dataclass(frozen=True)
class Copy:
    """Copy the local file or directory `local` to `path` in the build sandbox."""

    local: Path
    path: str

    def describe(self) -> str:
        """How the step is named in output and errors."""
        return f"copy {str(self.local)!r} to {self.path!r}"


Step = Run | Copy
Output = Callable[[str, bytes], None]  # ("stdout" | "stderr" | "step", chunk)


class BuildFailed(errors.Error):
    """A build step failed: `step` is its number (1-based), `exit_code` the command's (None for a
    copy), `tail` the last of its output."""

    def __init__(self, message: str, *, step: int, exit_code: int | None, tail: bytes) -> None:
        super().__init__(message)
        self.step = step
        self.exit_code = exit_code
        self.tail = tail


def parse_copy(text: str) -> Copy:
    """`LOCAL:PATH` (the last ':' splits them) as a step; InvalidArgument naming `--copy`."""
    local, sep, path = text.rpartition(":")
    if not sep or not local or not path.startswith("/"):
        raise errors.InvalidArgument(f"--copy: {text!r} must be LOCAL:PATH with an absolute PATH in the sandbox")
    return Copy(Path(local), path)


def build(
    client: Client,
    *,
    base: str,
    steps: Sequence[Step],
    tag: str,
    allow_net: Sequence[str] = (),
    force: bool = False,
    output: Output | None = None,
) -> views.SnapshotInfo:
    """Build image `tag` from `base` by `steps` (see the module doc); BuildFailed naming the step."""
    name = f"build-{secrets.token_hex(4)}"
    network = views.Network(allow=tuple(allow_net)) if allow_net else None
    sandbox = client.create(name=name, image=base, network=network)
    try:
        for number, step in enumerate(steps, start=1):
            if output is not None:
                output("step", f"step {number}/{len(steps)}: {step.describe()}\n".encode())
            _apply(sandbox, number, step, output)
        return sandbox.snapshot(tag, force=force)
    finally:
        with contextlib.suppress(errors.Error):
            sandbox.delete()


_TAIL_BYTES = 4096


def _apply(sandbox: Sandbox, number: int, step: Step, output: Output | None) -> None:
    if isinstance(step, Copy):
        try:
            if step.local.is_dir():
                sandbox.files.upload_dir(step.local, step.path)
            else:
                sandbox.files.upload(os.fspath(step.local), step.path)
        except (OSError, errors.ApiError) as exc:
            raise BuildFailed(
                f"step {number} ({step.describe()}) failed: {exc}", step=number, exit_code=None, tail=b""
            ) from exc
        return
    tail = b""
    code: int | None = None
    for event in sandbox.run_stream(["/bin/sh", "-c", step.command]):
        for stream, chunk in (("stdout", event.stdout), ("stderr", event.stderr)):
            if chunk:
                tail = (tail + chunk)[-_TAIL_BYTES:]
                if output is not None:
                    output(stream, chunk)
        if event.exit_code is not None:
            code = event.exit_code
    if code != 0:
        raise BuildFailed(f"step {number} ({step.describe()}) exited {code}", step=number, exit_code=code, tail=tail)
