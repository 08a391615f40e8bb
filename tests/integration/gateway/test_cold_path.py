"""Cold create -> Ready -> exec -> delete through a real gateway and real bwrap'd supervisors."""

from __future__ import annotations

import os
import stat

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from warmshell.api.v1 import sandbox_pb2 as pb


async def test_create_ready_exec_delete(gw: RunningGateway) -> None:
    created = await gw.create(name="alpha", spec=pb.SandboxSpec(environment={"FOO": "bar"}), labels={"team": "a"})
    # A cold start on this driver can finish (register, connect) before the create's own write
    # lands, and the create then answers with what is true by then.
    assert created.status.phase in (pb.SANDBOX_PHASE_PROVISIONING, pb.SANDBOX_PHASE_READY)
    assert created.status.allocation == "cold"
    ready = await gw.wait_ready("alpha")
    assert ready.status.phase == pb.SANDBOX_PHASE_READY
    assert ready.status.allocation == "cold"
    timeline = ready.status.timeline
    assert 0 < timeline.requested_us <= timeline.backend_created_us <= timeline.ready_us
    assert timeline.registered_us
    assert timeline.activated_us

    code, out, err = await gw.exec(
        "alpha", ["sh", "-c", 'echo "$FOO $BAR"; hostname; pwd; echo oops >&2; exit 3'], environment={"BAR": "baz"}
    )
    assert (code, out, err) == (3, b"bar baz\nalpha\n/workspace\n", b"oops\n")

    code, out, _ = await gw.exec("alpha", ["cat"], stdin=b"piped")
    assert (code, out) == (0, b"piped")
    code, _, err = await gw.exec("alpha", ["no-such-program"])
    assert (code, err) == (127, b"")  # told by the outcome (see test_exec_errors), not on stderr
    code, _, _ = await gw.exec("alpha", ["sleep", "5"], timeout_seconds=1)
    assert code == 124

    await gw.delete("alpha")
    with pytest.raises(grpc.aio.AioRpcError) as err_info:
        await gw.get("alpha")
    assert err_info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_sandbox_is_isolated(gw: RunningGateway) -> None:
    await gw.create(name="iso")
    await gw.wait_ready("iso")
    code, out, _ = await gw.exec(
        "iso",
        [
            "sh",
            "-c",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo pid=$$;"
            " touch /etc/x 2>/dev/null || echo ro; env | grep -c WARMSHELL_BOOT || true",
        ],
    )
    assert code == 0
    lines = out.decode().split()
    assert lines[0] == "lo"  # own network namespace: loopback only
    assert "ro" in lines  # host root is read-only
    assert lines[-1] == "0"  # the bootstrap credential is not in the workload's environment
    pid_line = next(line for line in lines if line.startswith("pid="))
    assert int(pid_line.removeprefix("pid=")) < 100  # own pid namespace


async def test_workload_exit_is_terminal_and_visible(gw: RunningGateway) -> None:
    await gw.create(name="job", spec=pb.SandboxSpec(command=["sh", "-c", "echo out; echo err >&2; exit 7"]))
    output = b""
    final = None
    request = pb.WatchSandboxRequest(name="job", follow_output=True, stop_on_terminal=True)
    async for event in gw.stub.WatchSandbox(request, metadata=gw.metadata):
        if event.HasField("output"):
            output += event.output.data
        if event.HasField("sandbox"):
            final = event.sandbox
    assert final is not None
    assert final.status.phase == pb.SANDBOX_PHASE_EXITED  # finished (non-zero), not broken
    assert final.status.exit_code == 7
    assert sorted(output.split()) == [b"err", b"out"]
    reasons = {c.type: c.reason for c in final.status.conditions}
    assert reasons["WorkloadExited"] == "Failed"
    with pytest.raises(grpc.aio.AioRpcError) as err_info:
        await gw.exec("job", ["true"])
    assert err_info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_state_files_are_private(gw: RunningGateway) -> None:
    paths = gw.gateway.paths
    for path in (paths.socket, paths.api_token, paths.signing_key, paths.database):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
