"""The pure half of every SDK call, shared by the sync and the async client: building the
request messages from keyword arguments, and deciding what each streamed event means.

The clients only move these messages over their channel, so both behave identically. The
views (dataclasses, whose import and creation cost a CLI call milliseconds) are imported where a
message is first turned into one: the CLI renders the messages and never needs them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from warmshell.api.v1 import outcome_pb2
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import errors

if TYPE_CHECKING:
    from warmshell.sdk import views

__all__ = [
    "EXEC_DEADLINE_MARGIN_SECONDS",
    "UNARY_TIMEOUT_SECONDS",
    "CreateOptions",
    "ExecFold",
    "ExitFold",
    "ReadyFold",
    "WaitOutcome",
    "WatchFold",
    "create_request",
    "exec_deadline",
    "exec_request",
    "failure",
    "label_selector",
    "not_ready_in_time",
    "output_event",
    "ready_outcome",
    "spec_conflict",
    "spec_differences",
]

# Unary calls do bounded work on the gateway; a hung gateway must not hang an agent forever.
UNARY_TIMEOUT_SECONDS = 60.0
_UINT32_MAX = 2**32 - 1
# Seconds granted beyond a command's own timeout before the client gives up on the stream.
EXEC_DEADLINE_MARGIN_SECONDS = 30.0


class WaitOutcome(Enum):
    """What one snapshot means to a caller waiting for Ready."""

    PENDING = "pending"
    READY = "ready"
    EXITED = "exited"
    FAILED = "failed"


def _argv(argv: Sequence[str], field: str) -> list[str]:
    if isinstance(argv, str | bytes):
        # A string is not split here: shell parsing is the caller's explicit choice.
        raise TypeError(f"{field} is an argv list, e.g. ['sh', '-c', {argv!r}]")
    return list(argv)


class CreateOptions(TypedDict, total=False):
    """What a new sandbox is asked to be, beside its name and workspace: the keyword arguments
    of `Client.create` (and its async twin) and of `warmshell sandbox create`'s flags, declared
    once. Unset lifetimes leave the gateway's defaults in force."""

    image: str
    env: Mapping[str, str] | None
    # A `views.Secret` is for some hosts only: the workload sees a placeholder.
    secrets: Mapping[str, str | views.Secret] | None
    cpu: str
    memory: str
    pids: int
    # None or empty: the image's Entrypoint + Cmd where the gateway knows them, else none.
    command: Sequence[str] | None
    # True: no workload at all, even where the image has an Entrypoint/Cmd (exec only).
    no_command: bool
    labels: Mapping[str, str] | None
    ttl_seconds: int | None
    idle_timeout_seconds: int | None
    network: views.Network | None


def create_request(*, name: str | None, workspace: str, **options: Unpack[CreateOptions]) -> pb.CreateSandboxRequest:
    """A CreateSandboxRequest; unset TTL/idle timeout leave the gateway's defaults in force.
    An option `CreateOptions` does not have is a TypeError, as for any keyword argument."""
    known = CreateOptions.__optional_keys__
    if unknown := sorted(options.keys() - known):
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} (the options are {', '.join(sorted(known))})")
    resources = pb.Resources(cpu=options.get("cpu", ""), memory=options.get("memory", ""), pids=options.get("pids", 0))
    secrets, network = options.get("secrets") or {}, options.get("network")
    request = pb.CreateSandboxRequest(
        name=name or "",
        workspace=workspace,
        labels=dict(options.get("labels") or {}),
        spec=pb.SandboxSpec(
            image=options.get("image", ""),
            environment=dict(options.get("env") or {}),
            secrets={name: secret if isinstance(secret, str) else secret.value for name, secret in secrets.items()},
            secret_hosts={
                name: pb.SecretHosts(hosts=list(secret.hosts))
                for name, secret in secrets.items()
                if not isinstance(secret, str) and secret.hosts
            },
            resources=resources,
            command=_argv(options.get("command") or [], "command"),
            network=pb.NetworkPolicy(allow=network.allow, deny=network.deny) if network is not None else None,
            no_command=bool(options.get("no_command", False)),
        ),
    )
    ttl_seconds, idle_timeout_seconds = options.get("ttl_seconds"), options.get("idle_timeout_seconds")
    if ttl_seconds is not None:
        request.ttl_seconds = _seconds(ttl_seconds, "ttl_seconds")
    if idle_timeout_seconds is not None:
        request.idle_timeout_seconds = _seconds(idle_timeout_seconds, "idle_timeout_seconds")
    return request


def _quantity(parse: Callable[[str], int], text: str) -> int | str:
    """A quantity in whole units, so "0.5" and "500m" compare equal; unparsable text as it is
    (the gateway, which refused it, names the rule)."""
    from warmshell.core.errors import InvalidArgumentError

    try:
        return parse(text) if text else 0
    except InvalidArgumentError:
        return text


def _spec_fields() -> dict[str, tuple[Callable[[pb.Sandbox], object], Callable[[Any], object]]]:
    """Per create option: its value on an existing sandbox, and a given value in the same form."""
    from warmshell.core import quantities

    return {
        "image": (lambda s: s.spec.image, str),
        "env": (lambda s: dict(s.spec.environment), dict),
        "secrets": (lambda s: sorted(s.spec.secrets), sorted),  # names only: values are never shown
        "cpu": (
            lambda s: _quantity(quantities.cpu_millis, s.spec.resources.cpu),
            lambda v: _quantity(quantities.cpu_millis, v),
        ),
        "memory": (
            lambda s: _quantity(quantities.memory_bytes, s.spec.resources.memory),
            lambda v: _quantity(quantities.memory_bytes, v),
        ),
        "pids": (lambda s: s.spec.resources.pids, int),
        "command": (lambda s: list(s.spec.command), lambda v: _argv(v, "command")),
        "no_command": (lambda s: s.spec.no_command, bool),
        "labels": (lambda s: dict(s.labels), dict),
        "ttl_seconds": (lambda s: s.lifetime.ttl_seconds, lambda v: _seconds(v, "ttl_seconds")),
        "idle_timeout_seconds": (
            lambda s: s.lifetime.idle_timeout_seconds,
            lambda v: _seconds(v, "idle_timeout_seconds"),
        ),
        "network": (
            lambda s: (list(s.spec.network.allow), list(s.spec.network.deny)),
            lambda v: (list(v.allow), list(v.deny)),
        ),
    }


def spec_differences(existing: pb.Sandbox, options: CreateOptions) -> list[str]:
    """The create options given (not None, not empty) that `existing` does not have, by name."""
    fields = _spec_fields()
    given = {name: value for name, value in options.items() if value is not None and value != ""}
    return [name for name, value in given.items() if fields[name][0](existing) != fields[name][1](value)]


def spec_conflict(existing: pb.Sandbox, differences: Sequence[str]) -> errors.Conflict:
    """The Conflict of a get-or-create whose sandbox exists with another spec."""
    where = f"{existing.workspace}/{existing.name}"
    return errors.Conflict(
        f"sandbox {where} exists with a different {', '.join(differences)}",
        code="ALREADY_EXISTS",
        hint="get_or_create returns a sandbox only when every option given matches it",
    )


def ask_ready(
    request: pb.CreateSandboxRequest, *, ready_timeout: float | None, call_timeout: float | None
) -> float | None:
    """Ask the gateway to answer `request` once the sandbox is Ready (one call instead of a
    create and a watch); returns the create call's deadline. The gateway answers before that
    deadline, still Provisioning if need be, so a slow create still returns the sandbox's name
    (the caller then watches the rest, and deletes it if it fails). A gateway that predates the
    field answers at once, Provisioning: the same fallback."""
    wait = ready_timeout if ready_timeout is not None else call_timeout
    request.wait_ready = True
    if wait is not None:
        request.ready_timeout_ms = min(max(1, math.ceil(wait * 1000)), _UINT32_MAX)
    return None if call_timeout is None else call_timeout + (wait or 0)


def not_ready_in_time(name: str, timeout: float | None) -> errors.DeadlineExceeded:
    """The DeadlineExceeded of a create whose sandbox was not Ready within `timeout` seconds."""
    return errors.DeadlineExceeded(f"sandbox {name} was not Ready within {timeout:g} s", code="DEADLINE_EXCEEDED")


def remaining(timeout: float | None, started: float) -> float | None:
    """What is left of `timeout` seconds since `started` (time.monotonic), never quite zero."""
    return None if timeout is None else max(timeout - (time.monotonic() - started), 0.001)


def _seconds(value: float, field: str) -> int:
    if value < 0:
        raise errors.InvalidArgument(f"{field}: must not be negative")
    return math.ceil(value)


def exec_request(
    *,
    name: str,
    workspace: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None,
    workdir: str | None,
    timeout: float | None,
    stdin: bytes | str,
) -> pb.ExecSandboxRequest:
    """An ExecSandboxRequest; `timeout` (seconds, rounded up) is enforced inside the sandbox."""
    return pb.ExecSandboxRequest(
        name=name,
        workspace=workspace,
        command=_argv(argv, "argv"),
        environment=dict(env or {}),
        workdir=workdir or "",
        timeout_seconds=_seconds(timeout, "timeout") if timeout else 0,
        stdin=stdin.encode() if isinstance(stdin, str) else stdin,
    )


def exec_deadline(timeout: float | None) -> float | None:
    """The gRPC deadline of an exec stream: none without a command timeout, else a margin past it."""
    return None if not timeout else timeout + EXEC_DEADLINE_MARGIN_SECONDS


def label_selector(labels: Mapping[str, str] | None) -> str:
    """`{"k": "v"}` -> "k=v" (every pair must match); the wire syntax cannot carry `,` or `=`."""
    for key, value in (labels or {}).items():
        if any(sep in key for sep in ",=") or "," in value:
            raise errors.InvalidArgument(f"labels: {key!r}={value!r} may not contain ',' (or '=' in the key)")
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items()))


def output_event(event: pb.ExecEvent) -> views.OutputEvent:
    """One ExecEvent as the SDK yields it."""
    from warmshell.sdk import views

    kind = event.WhichOneof("event")
    if kind == "stdout":
        return views.OutputEvent(stdout=event.stdout, dropped_bytes=event.dropped_bytes)
    if kind == "stderr":
        return views.OutputEvent(stderr=event.stderr, dropped_bytes=event.dropped_bytes)
    return views.OutputEvent(exit_code=event.exit_code, outcome=views.exec_outcome(event.outcome))


def ready_outcome(sandbox: pb.Sandbox) -> WaitOutcome:
    """Whether a caller waiting for Ready is done, and how."""
    phase = sandbox.status.phase
    if phase == pb.SANDBOX_PHASE_READY:
        return WaitOutcome.READY
    if phase == pb.SANDBOX_PHASE_EXITED:
        return WaitOutcome.EXITED
    if phase in (pb.SANDBOX_PHASE_ERROR, pb.SANDBOX_PHASE_DELETING):
        return WaitOutcome.FAILED
    return WaitOutcome.PENDING


def failure(sandbox: pb.Sandbox | None, *, name: str, deleted: bool = False) -> errors.SandboxError:
    """The SandboxError for a sandbox that failed (or vanished) while waited on."""
    from warmshell.sdk import views

    info = views.sandbox_info(sandbox) if sandbox is not None else None
    if deleted or info is None:
        return errors.SandboxError(f"sandbox {name} was deleted", reason="Deleted", sandbox=info)
    ready = info.condition("Ready")
    reason = ready.reason if ready is not None else info.phase.value
    return errors.SandboxError(
        f"sandbox {name} is {info.phase.value}: {info.reason or reason}", reason=reason, sandbox=info
    )


class WatchFold:
    """Follows a WatchSandbox stream and decides when a wait for a new sandbox is over: once it
    is Ready or has exited (with `until_exit`: once its workload has exited), or as soon as it
    fails or is deleted. With `follow_output` the stream is read to its end instead, since the
    gateway ends it after the last output of a terminal sandbox, so no output is left unread.
    It only decides; what a failure means (an exception, an exit code) is the caller's."""

    def __init__(self, created: pb.Sandbox, *, until_exit: bool = False, follow_output: bool = False) -> None:
        self.last = created
        self.deleted = False  # the stream said the sandbox is gone
        self.until_exit = until_exit
        self.follow_output = follow_output

    def watch_request(self) -> pb.WatchSandboxRequest:
        """The WatchSandbox request this wait reads."""
        return pb.WatchSandboxRequest(
            name=self.last.name,
            workspace=self.last.workspace,
            follow_output=self.follow_output,
            stop_on_terminal=True,
            stop_on_ready=not self.until_exit,
        )

    def outcome(self) -> WaitOutcome:
        """What the latest snapshot (or a deletion) means to the caller."""
        return WaitOutcome.FAILED if self.deleted else ready_outcome(self.last)

    def failure(self) -> errors.SandboxError:
        """The SandboxError for a wait that failed."""
        return failure(self.last, name=self.last.name, deleted=self.deleted)

    def done(self) -> bool:
        """Whether the wait is over."""
        if self.deleted or self.last.status.phase == pb.SANDBOX_PHASE_DELETING:
            return True  # gone: there is nothing more to read
        outcome = self.outcome()
        if outcome is WaitOutcome.PENDING or self.follow_output:
            return False
        return not (self.until_exit and outcome is WaitOutcome.READY)

    def feed(self, event: pb.SandboxEvent) -> bool:
        """Take one event; True once the wait is over."""
        kind = event.WhichOneof("event")
        if kind == "deleted":
            self.deleted = True
        elif kind == "sandbox":
            self.last = event.sandbox
        else:
            return False
        return self.done()


class ReadyFold(WatchFold):
    """The SDK's wait for Ready (or a workload that already exited): a sandbox that fails or
    is deleted raises SandboxError."""

    def done(self) -> bool:
        """Whether the wait is over (raises if the sandbox failed)."""
        over = super().done()
        if over and self.outcome() is WaitOutcome.FAILED:
            raise self.failure()
        return over


class ExitFold:
    """Follows a WatchSandbox stream with output to its end: the workload's output and exit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last: pb.Sandbox | None = None
        self.stdout = bytearray()
        self.stderr = bytearray()

    def feed(self, event: pb.SandboxEvent) -> None:
        """Take one event (the stream ends by itself once the sandbox is terminal)."""
        kind = event.WhichOneof("event")
        if kind == "sandbox":
            self.last = event.sandbox
        elif kind == "output":
            stderr = event.output.stream == pb.OutputChunk.STREAM_STDERR
            (self.stderr if stderr else self.stdout).extend(event.output.data)
        elif kind == "deleted":
            raise failure(self.last, name=self.name, deleted=True)

    def result(self) -> views.ExecResult:
        """The workload's result once the stream has ended; SandboxError if it did not exit."""
        from warmshell.sdk import views

        last = self.last
        if last is None or ready_outcome(last) is not WaitOutcome.EXITED:
            raise failure(last, name=self.name)
        timeline = last.status.timeline
        ran_us = timeline.exited_us - timeline.activated_us if timeline.activated_us else 0
        return views.ExecResult(last.status.exit_code, bytes(self.stdout), bytes(self.stderr), max(ran_us, 0) / 1000)


class ExecFold:
    """Collects an ExecSandbox stream into an ExecResult."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exit_code: int | None = None
        self.outcome: outcome_pb2.ExecOutcome | None = None

    def feed(self, event: pb.ExecEvent) -> None:
        """Take one event."""
        kind = event.WhichOneof("event")
        if kind == "stdout":
            self.stdout.extend(event.stdout)
        elif kind == "stderr":
            self.stderr.extend(event.stderr)
        elif kind == "exit_code":
            self.exit_code, self.outcome = event.exit_code, event.outcome

    def result(self, duration_ms: float) -> views.ExecResult:
        """The finished command (an Error if the stream ended without an exit code)."""
        from warmshell.sdk import views

        if self.exit_code is None:
            raise errors.Error("the exec stream ended without an exit code")
        outcome = views.exec_outcome(self.outcome if self.outcome is not None else outcome_pb2.ExecOutcome())
        return views.ExecResult(self.exit_code, bytes(self.stdout), bytes(self.stderr), duration_ms, outcome)


def fork_request(
    name: str, workspace: str, *, count: int, prefix: str, with_secrets: bool, ready_timeout: float | None
) -> pb.ForkSandboxRequest:
    """A ForkSandbox request that waits up to `ready_timeout` seconds for the children."""
    return pb.ForkSandboxRequest(
        name=name,
        workspace=workspace,
        count=count,
        prefix=prefix,
        with_secrets=with_secrets,
        ready_timeout_ms=int((ready_timeout or 0) * 1000),
    )


def fork_call_timeout(ready_timeout: float | None, call_timeout: float | None) -> float | None:
    """The deadline of a fork call: the children's wait for Ready plus the call's own."""
    if ready_timeout is None or call_timeout is None:
        return None
    return ready_timeout + call_timeout


def fork_outcome(child: pb.ForkChild) -> pb.Sandbox | errors.ApiError:
    """A child of a fork: its Ready sandbox, or the error it ended with."""
    if child.error_code:
        return errors.error_for(child.error_code, child.error)
    if child.sandbox.status.phase != pb.SANDBOX_PHASE_READY:
        phase = pb.SandboxPhase.Name(child.sandbox.status.phase).removeprefix("SANDBOX_PHASE_")
        return errors.error_for(
            "UNAVAILABLE" if phase == "PROVISIONING" else "FAILED_PRECONDITION",
            f"fork child {child.name} is {phase.title()}, not Ready",
        )
    return child.sandbox


def resume_request(name: str, workspace: str, *, ready_timeout: float | None) -> pb.ResumeSandboxRequest:
    """A ResumeSandbox request that waits up to `ready_timeout` seconds for Ready."""
    return pb.ResumeSandboxRequest(
        name=name, workspace=workspace, wait_ready=True, ready_timeout_ms=int((ready_timeout or 0) * 1000)
    )


def resumed(message: pb.Sandbox) -> pb.Sandbox:
    """A resumed sandbox, Ready; SandboxError saying how it is when it is not."""
    if message.status.phase != pb.SANDBOX_PHASE_READY:
        phase = pb.SandboxPhase.Name(message.status.phase).removeprefix("SANDBOX_PHASE_").title()
        raise errors.SandboxError(f"sandbox {message.name} did not resume: it is {phase}")
    return message
