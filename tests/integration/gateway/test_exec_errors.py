"""Exec outcomes say what went wrong, in the result and never in the command's output: a missing
workdir is not a missing command, a timeout is not the command's own 124 (real gateway, real
bwrap'd sandbox, the wire messages themselves)."""

from __future__ import annotations

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import outcome_pb2
from warmshell.api.v1 import sandbox_pb2 as pb


async def _last(gw: RunningGateway, command: list[str], **fields: object) -> tuple[list[pb.ExecEvent], pb.ExecEvent]:
    request = pb.ExecSandboxRequest(name="wd", command=command, **fields)  # type: ignore[arg-type]
    events = [event async for event in gw.stub.ExecSandbox(request, metadata=gw.metadata)]
    return events[:-1], events[-1]


async def test_a_missing_workdir_is_an_outcome_naming_it_not_command_not_found(gw: RunningGateway) -> None:
    await gw.create(name="wd")
    assert (await gw.wait_ready("wd")).status.phase == pb.SANDBOX_PHASE_READY
    output, end = await _last(gw, ["true"], workdir="/nope")
    assert (output, end.exit_code, end.outcome.error) == ([], 125, outcome_pb2.EXEC_ERROR_WORKDIR)
    assert end.outcome.error_message == "workdir /nope does not exist"
    code, _, _ = await gw.exec("wd", ["sh", "-c", "echo x > /workspace/file"])
    assert code == 0
    _, end = await _last(gw, ["true"], workdir="/workspace/file")
    assert end.outcome.error_message == "workdir /workspace/file is not a directory"
    # A missing command in a good workdir is the shell's 127, with nothing written on its stderr.
    output, end = await _last(gw, ["no-such-program"], workdir="/tmp")
    assert (output, end.exit_code, end.outcome.error) == ([], 127, outcome_pb2.EXEC_ERROR_COMMAND_NOT_FOUND)
    assert end.outcome.error_message == "no-such-program: command not found"


async def test_a_timeout_is_the_outcomes_and_a_commands_own_124_is_not(gw: RunningGateway) -> None:
    await gw.create(name="wd")
    await gw.wait_ready("wd")
    output, end = await _last(gw, ["sleep", "30"], timeout_seconds=1)
    assert (output, end.exit_code, end.outcome.timed_out, end.outcome.signal) == ([], 124, True, 9)
    _, end = await _last(gw, ["sh", "-c", "exit 124"])
    assert (end.exit_code, end.outcome.timed_out, end.outcome.signal) == (124, False, 0)
