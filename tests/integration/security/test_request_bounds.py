"""Requests at and past the API's size bounds on a real gateway: exec and create with the largest
argv and environment validation lets through (together more than the agent's 128 KiB command
record, one argument longer than the kernel's MAX_ARG_STRLEN), and creates that wait for Ready
with the largest `ready_timeout_ms`, many at once.

What must hold: each request runs or is refused with a clear status naming the field (never
INTERNAL or UNKNOWN, never a sandbox left half made), a waiting create ends when its sandbox
settles whatever the timeout asked, and the gateway serves others meanwhile."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, still_real
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.validation import MAX_COMMAND_ARGS, MAX_COMMAND_BYTES, MAX_ENV_BYTES, MAX_ENV_VARS

pytestmark = [needs_bwrap, pytest.mark.timeout(240)]

CLEAR = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION)


def _largest_argv() -> list[str]:
    """MAX_COMMAND_ARGS arguments filling MAX_COMMAND_BYTES (the program counted)."""
    program = "/bin/true"
    each = (MAX_COMMAND_BYTES - len(program)) // (MAX_COMMAND_ARGS - 1)
    return [program] + ["a" * each] * (MAX_COMMAND_ARGS - 1)


def _largest_env() -> dict[str, str]:
    each = MAX_ENV_BYTES // MAX_ENV_VARS - 8
    return {f"V{i:04d}": "e" * each for i in range(MAX_ENV_VARS)}


async def _exec_outcome(gw: RunningGateway, name: str, command: list[str], env: dict[str, str]) -> tuple[str, str]:
    request = pb.ExecSandboxRequest(name=name, command=command, environment=env)
    try:
        async with asyncio.timeout(30):
            events = [event async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata)]
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return f"exit {events[-1].exit_code}", events[-1].outcome.error_message  # why it never started


@pytest.mark.parametrize(
    ("label", "command", "env"),
    [
        ("the largest argv and environment together", _largest_argv(), _largest_env()),
        ("one argument past MAX_ARG_STRLEN", ["/bin/true", "x" * (MAX_COMMAND_BYTES - len("/bin/true"))], {}),
        ("the largest argv", _largest_argv(), {}),
    ],
)
async def test_an_exec_at_the_bounds_runs_or_is_refused_clearly(
    gw: RunningGateway, label: str, command: list[str], env: dict[str, str]
) -> None:
    await sandbox(gw, "big")
    outcome, detail = await _exec_outcome(gw, "big", command, env)
    # It ran, or it never started and says why (as execve's E2BIG does in a shell: 126), or the
    # request was refused naming the field; never a call that does not end.
    assert outcome in {"exit 0", "exit 126"} | {c.name for c in CLEAR}, (label, outcome, detail)
    if outcome != "exit 0":
        assert any(word in detail for word in ("command", "environment", "argument")), (label, detail)
    await still_real(gw, "big")


async def test_a_create_at_the_bounds_runs_or_is_refused_leaving_nothing(gw: RunningGateway) -> None:
    spec = pb.SandboxSpec(command=_largest_argv(), environment=_largest_env())
    request = pb.CreateSandboxRequest(name="huge", spec=spec, wait_ready=True, ready_timeout_ms=60_000)
    created: pb.Sandbox | None = None
    refused: grpc.StatusCode | None = None
    try:
        created = await gw.stub.CreateSandbox(request, metadata=gw.metadata)
    except grpc.aio.AioRpcError as exc:
        refused = exc.code()
    if created is None:
        assert refused in CLEAR
        listed = await gw.stub.ListSandboxes(pb.ListSandboxesRequest(all_workspaces=True), metadata=gw.metadata)
        assert "huge" not in [s.name for s in listed.sandboxes]
    else:
        # Accepted: the workload (/bin/true) runs and exits, or it cannot start and the sandbox
        # says so by exiting 126; never a Ready sandbox whose workload silently never ran.
        assert created.status.phase != pb.SANDBOX_PHASE_PROVISIONING, created
        ended = await gw.wait_for("huge", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED, timeout=30)
        assert ended.status.exit_code in (0, 126), ended.status


async def test_waiting_creates_with_the_largest_timeout_end_when_their_sandbox_settles(gw: RunningGateway) -> None:
    """32 creates asking to wait 49 days (the field's maximum) for a sandbox whose workload exits
    at once: every call returns when its sandbox settles, and other calls are served meanwhile."""
    count = 32
    started = time.monotonic()
    waits = [
        asyncio.ensure_future(
            gw.stub.CreateSandbox(
                pb.CreateSandboxRequest(
                    name=f"w{i}",
                    spec=pb.SandboxSpec(command=["/bin/sh", "-c", "exit 3"]),
                    wait_ready=True,
                    ready_timeout_ms=2**32 - 1,
                ),
                metadata=gw.metadata,
            )
        )
        for i in range(count)
    ]
    # The gateway answers others while they wait.
    probe = time.monotonic()
    await gw.stub.ListPools(pb.ListPoolsRequest(all_workspaces=True), metadata=gw.metadata, timeout=10)
    assert time.monotonic() - probe < 10
    results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 150)
    unclear = [r for r in results if isinstance(r, BaseException) and not isinstance(r, grpc.aio.AioRpcError)]
    assert not unclear, unclear
    answered = [r for r in results if isinstance(r, pb.Sandbox)]
    assert len(answered) + sum(isinstance(r, grpc.aio.AioRpcError) for r in results) == count
    for sandbox_ in answered:
        assert sandbox_.status.phase != pb.SANDBOX_PHASE_PROVISIONING, sandbox_
    assert time.monotonic() - started < 150
