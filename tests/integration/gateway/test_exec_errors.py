"""Exec errors say what went wrong: a missing workdir is not a missing command (real gateway,
real bwrap'd sandbox)."""

from __future__ import annotations

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import sandbox_pb2 as pb


async def test_a_missing_workdir_is_an_error_naming_it_not_command_not_found(gw: RunningGateway) -> None:
    await gw.create(name="wd")
    assert (await gw.wait_ready("wd")).status.phase == pb.SANDBOX_PHASE_READY
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await gw.exec("wd", ["true"], workdir="/nope")
    assert missing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "workdir /nope does not exist" in (missing.value.details() or "")
    code, _, _ = await gw.exec("wd", ["sh", "-c", "echo x > /workspace/file"])
    assert code == 0
    with pytest.raises(grpc.aio.AioRpcError) as not_dir:
        await gw.exec("wd", ["true"], workdir="/workspace/file")
    assert "workdir /workspace/file is not a directory" in (not_dir.value.details() or "")
    # A missing command in a good workdir is still the shell's 127.
    code, _, err = await gw.exec("wd", ["no-such-program"], workdir="/tmp")
    assert code == 127
    assert b"command not found" in err
