"""Command behaviour of the real CLI against a fake gateway on a Unix socket: what it sends,
what it prints, and the exit code scripts see."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.grpc import serve_for
from tests.unit.cli.fakes import FakeSandboxService, event, invoke, sandbox
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.cli.errors import ExitCode

READY = pb.SANDBOX_PHASE_READY
ERROR = pb.SANDBOX_PHASE_ERROR


@pytest.fixture
def fake() -> FakeSandboxService:
    return FakeSandboxService()


@pytest.fixture
async def address(fake: FakeSandboxService) -> AsyncIterator[str]:
    async with serve_for(fake) as served:
        yield served.address


def _timeline(**steps: int) -> pb.Timeline:
    return pb.Timeline(requested_us=1_000_000, **steps)


async def test_create_sends_the_flags_and_prints_a_summary_once_ready(fake: FakeSandboxService, address: str) -> None:
    ready = sandbox("box", READY, allocation="warm", pool="python-small", timeline=_timeline(ready_us=1_004_500))
    fake.watch_events = [
        event(sandbox=sandbox("box")),
        event(progress=pb.ProgressEvent(reason="Claimed", message="claimed a warm instance")),
        event(sandbox=ready),
    ]
    args = ["sandbox", "create", "--name", "box", "--env", "FOO=a=b", "-e", "EMPTY="]
    args += ["--label", "team=ml", "--cpu", "0.2", "--memory", "256Mi", "--image", "/img"]
    result = await invoke(address, args)

    assert result.exit_code == 0, result.output
    method, request = fake.requests[0]
    assert method == "CreateSandbox"
    assert isinstance(request, pb.CreateSandboxRequest)
    assert dict(request.spec.environment) == {"FOO": "a=b", "EMPTY": ""}
    assert dict(request.labels) == {"team": "ml"}
    assert (request.spec.resources.cpu, request.spec.resources.memory) == ("0.2", "256Mi")
    assert request.spec.image == "/img"
    assert list(request.spec.command) == []
    assert not request.spec.no_command
    watch = fake.requests[1][1]
    assert isinstance(watch, pb.WatchSandboxRequest)
    assert watch.stop_on_ready
    assert not watch.follow_output
    assert "box" in result.stdout
    assert "warm (pool python-small)" in result.stdout
    assert "4.50 ms to Ready" in result.stdout


async def test_create_no_command_asks_for_no_workload(fake: FakeSandboxService, address: str) -> None:
    fake.watch_events = [event(sandbox=sandbox("idle", READY))]
    result = await invoke(address, ["sandbox", "create", "--name", "idle", "--image", "py:3", "--no-command"])
    assert result.exit_code == 0, result.output
    request = fake.requests[0][1]
    assert isinstance(request, pb.CreateSandboxRequest)
    assert (request.spec.no_command, list(request.spec.command)) == (True, [])


async def test_create_with_a_command_streams_output_and_exits_with_its_code(
    fake: FakeSandboxService, address: str
) -> None:
    out = pb.OutputChunk.STREAM_STDOUT
    err = pb.OutputChunk.STREAM_STDERR
    fake.watch_events = [
        event(sandbox=sandbox("job")),
        event(output=pb.OutputChunk(stream=out, data=b"hello ")),
        event(output=pb.OutputChunk(stream=err, data=b"oops\n")),
        event(output=pb.OutputChunk(stream=out, data=b"world\n")),
        event(sandbox=sandbox("job", ERROR, exit_code=3)),
    ]
    result = await invoke(address, ["sandbox", "create", "--name", "job", "--", "sh", "-c", "x"])

    assert result.exit_code == 3
    assert result.stdout == "hello world\n"
    assert result.stderr == "oops\n"
    create = fake.requests[0][1]
    assert isinstance(create, pb.CreateSandboxRequest)
    assert list(create.spec.command) == ["sh", "-c", "x"]
    watch = fake.requests[1][1]
    assert isinstance(watch, pb.WatchSandboxRequest)
    assert watch.follow_output
    assert watch.stop_on_terminal
    assert not watch.stop_on_ready


async def test_create_reports_the_conditions_when_the_sandbox_fails_before_ready(
    fake: FakeSandboxService, address: str
) -> None:
    failed = sandbox(
        "box",
        ERROR,
        conditions=[pb.Condition(type="Ready", status="False", reason="SupervisorNotConnected", message="gone")],
    )
    fake.watch_events = [event(sandbox=failed)]
    result = await invoke(address, ["sandbox", "create", "--name", "box"])

    assert result.exit_code == ExitCode.SANDBOX_FAILED
    assert "error: sandbox box failed: Ready=False (SupervisorNotConnected): gone" in result.stderr


async def test_create_json_prints_the_final_sandbox(fake: FakeSandboxService, address: str) -> None:
    fake.watch_events = [event(sandbox=sandbox("box", READY, allocation="cold"))]
    result = await invoke(address, ["sandbox", "create", "--name", "box", "-o", "json"])

    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert document["name"] == "box"
    assert document["status"]["phase"] == "SANDBOX_PHASE_READY"
    assert document["status"]["allocation"] == "cold"
    # Every field is present even when unset, so scripts can rely on the shape.
    assert document["spec"]["command"] == []
    assert document["labels"] == {}


async def test_create_json_with_a_command_waits_for_the_exit_without_following_output(
    fake: FakeSandboxService, address: str
) -> None:
    fake.watch_events = [event(sandbox=sandbox("job", ERROR, exit_code=4))]
    result = await invoke(address, ["sandbox", "create", "--name", "job", "-o", "json", "--", "false"])

    assert result.exit_code == 4
    assert json.loads(result.stdout)["status"]["exit_code"] == 4
    watch = fake.requests[1][1]
    assert isinstance(watch, pb.WatchSandboxRequest)
    assert not watch.follow_output  # stdout carries only the JSON document
    assert not watch.stop_on_ready


async def test_create_detach_returns_without_watching(fake: FakeSandboxService, address: str) -> None:
    result = await invoke(address, ["sandbox", "create", "--name", "box", "--detach"])

    assert result.exit_code == 0
    assert [method for method, _ in fake.requests] == ["CreateSandbox"]
    assert "sandbox box created" in result.stdout


async def test_create_gives_up_after_timeout(fake: FakeSandboxService, address: str) -> None:
    fake.watch_events = [event(sandbox=sandbox("slow"))]
    fake.watch_hangs = True
    result = await invoke(address, ["sandbox", "create", "--name", "slow", "--timeout", "0.2"])

    assert result.exit_code == ExitCode.TIMEOUT
    assert "error: sandbox slow was not Ready within 0.2 s" in result.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--env", "NOVALUE"], "--env"),
        (["--env", "=x"], "--env"),
        (["--label", "a=1", "--label", "a=2"], "--label"),
    ],
)
async def test_malformed_pairs_are_usage_errors_naming_the_flag(
    fake: FakeSandboxService, address: str, args: list[str], flag: str
) -> None:
    result = await invoke(address, ["sandbox", "create", *args])

    assert result.exit_code == ExitCode.USAGE
    assert flag in result.stderr
    assert fake.requests == []  # nothing reached the gateway


@pytest.mark.parametrize(
    ("status", "exit_code"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, ExitCode.INVALID_ARGUMENT),
        (grpc.StatusCode.ALREADY_EXISTS, ExitCode.ALREADY_EXISTS),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ExitCode.RESOURCE_EXHAUSTED),
        (grpc.StatusCode.PERMISSION_DENIED, ExitCode.PERMISSION_DENIED),
        (grpc.StatusCode.INTERNAL, ExitCode.FAILURE),
    ],
)
async def test_gateway_errors_print_the_message_and_map_to_an_exit_code(
    fake: FakeSandboxService, address: str, status: grpc.StatusCode, exit_code: ExitCode
) -> None:
    fake.create_error = (status, "name: 'Bad' must be a DNS-1123 label")
    result = await invoke(address, ["sandbox", "create", "--name", "Bad"])

    assert result.exit_code == exit_code
    assert result.stderr == "error: name: 'Bad' must be a DNS-1123 label\n"


async def test_unknown_sandbox_is_not_found(address: str) -> None:
    result = await invoke(address, ["sandbox", "get", "nope"])

    assert result.exit_code == ExitCode.NOT_FOUND
    assert result.stderr == 'error: sandbox "default/nope" not found\n'


async def test_a_wrong_token_is_unauthenticated_with_a_hint(address: str) -> None:
    result = await invoke(address, ["sandbox", "list"], token="wrong")

    assert result.exit_code == ExitCode.UNAUTHENTICATED
    assert "error: missing or invalid API token" in result.stderr
    assert "WARMSHELL_API_TOKEN" in result.stderr


async def test_a_missing_socket_says_so_and_suggests_starting_a_gateway(tmp_path: Path) -> None:
    result = await invoke(f"unix://{tmp_path}/gateway.sock", ["sandbox", "list"])

    assert result.exit_code == ExitCode.UNAVAILABLE
    assert f"error: no gateway socket at {tmp_path}/gateway.sock" in result.stderr
    assert "warmshell gateway start" in result.stderr


async def test_a_socket_nobody_listens_on_is_unavailable(tmp_path: Path) -> None:
    stale = tmp_path / "gateway.sock"
    stale.touch()  # left behind by a gateway that died
    result = await invoke(f"unix://{stale}", ["pool", "list"])

    assert result.exit_code == ExitCode.UNAVAILABLE
    assert "is unavailable" in result.stderr


async def test_exec_streams_output_and_exits_with_the_command_code(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["box"] = sandbox("box", READY)
    fake.exec_events = [
        pb.ExecEvent(stdout=b"out\n"),
        pb.ExecEvent(stderr=b"err\n"),
        pb.ExecEvent(exit_code=42),
    ]
    args = ["sandbox", "exec", "box", "-e", "A=1", "--workdir", "/w", "--timeout", "5"]
    result = await invoke(address, [*args, "--", "ls", "-la"])

    assert result.exit_code == 42
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    request = fake.requests[0][1]
    assert isinstance(request, pb.ExecSandboxRequest)
    assert list(request.command) == ["ls", "-la"]
    assert dict(request.environment) == {"A": "1"}
    assert (request.workdir, request.timeout_seconds) == ("/w", 5)


async def test_exec_json_collects_the_output(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["box"] = sandbox("box", READY)
    fake.exec_events = [pb.ExecEvent(stdout=b"hi\n"), pb.ExecEvent(exit_code=0)]
    result = await invoke(address, ["sandbox", "exec", "box", "-o", "json", "--", "echo", "hi"])

    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "exit_code": 0, "stdout": "hi\n", "stderr": "",
        "timed_out": False, "signal": 0, "error": None, "error_message": "",
    }  # fmt: skip


async def test_exec_without_an_exit_code_is_a_failure(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["box"] = sandbox("box", READY)
    fake.exec_events = [pb.ExecEvent(stdout=b"partial")]
    result = await invoke(address, ["sandbox", "exec", "box", "--", "true"])

    assert result.exit_code == ExitCode.FAILURE
    assert "without an exit code" in result.stderr


async def test_list_shows_a_row_per_sandbox(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["alpha"] = sandbox("alpha", READY, allocation="warm")
    fake.sandboxes["beta"] = sandbox("beta", ERROR, allocation="cold")
    result = await invoke(address, ["sandbox", "list", "-A", "-l", "team=ml"])

    assert result.exit_code == 0
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0] == ["NAME", "WORKSPACE", "PHASE", "ALLOCATION", "AGE", "IMAGE"]
    assert rows[1][:4] == ["alpha", "default", "Ready", "warm"]
    assert rows[2][:4] == ["beta", "default", "Error", "cold"]
    request = fake.requests[0][1]
    assert isinstance(request, pb.ListSandboxesRequest)
    assert request.all_workspaces
    assert request.label_selector == "team=ml"


async def test_get_shows_the_timeline_relative_to_requested(fake: FakeSandboxService, address: str) -> None:
    timeline = _timeline(backend_created_us=1_001_000, registered_us=1_002_250, ready_us=1_003_000)
    fake.sandboxes["box"] = sandbox("box", READY, allocation="cold", timeline=timeline)
    result = await invoke(address, ["sandbox", "get", "box"])

    assert result.exit_code == 0
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "backend created +1.00 ms" in lines
    assert "registered +2.25 ms" in lines
    assert "ready +3.00 ms" in lines
    assert "claimed -" in lines


async def test_delete_confirms(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["box"] = sandbox("box", READY)
    result = await invoke(address, ["sandbox", "delete", "box"])

    assert result.exit_code == 0
    assert result.stdout == "sandbox box deleted\n"
    assert "box" not in fake.sandboxes


async def test_watch_prints_transitions_and_progress(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["box"] = sandbox("box")
    fake.watch_events = [
        event(sandbox=sandbox("box")),
        event(sandbox=sandbox("box")),  # same phase again: not a transition
        event(progress=pb.ProgressEvent(type="Normal", reason="Registered", message="hello")),
        event(sandbox=sandbox("box", READY)),
        event(deleted="id-box"),
    ]
    result = await invoke(address, ["sandbox", "watch", "box"])

    assert result.exit_code == 0
    lines = [line.split(maxsplit=1)[1] for line in result.stdout.splitlines()]
    assert lines == [
        "phase Provisioning",
        "Normal  Registered: hello",
        "phase Ready",
        "sandbox box deleted",
    ]


async def test_watch_lines_are_in_time_order(fake: FakeSandboxService, address: str) -> None:
    # The progress event's own time is older than the phase line before it; the lines are still
    # stamped in order, on the CLI's clock, as they arrive.
    fake.sandboxes["box"] = sandbox("box")
    fake.watch_events = [
        event(sandbox=sandbox("box")),
        event(progress=pb.ProgressEvent(timestamp_ms=1_000, reason="Claimed", message="long ago")),
        event(sandbox=sandbox("box", READY)),
        event(deleted="id-box"),
    ]
    result = await invoke(address, ["sandbox", "watch", "box"])

    assert result.exit_code == 0
    stamps = [line.split(maxsplit=1)[0] for line in result.stdout.splitlines()]
    assert len(stamps) == 4
    assert "--:--" not in "".join(stamps)
    assert stamps == sorted(stamps)


async def test_watch_json_prints_one_event_per_line(fake: FakeSandboxService, address: str) -> None:
    fake.sandboxes["box"] = sandbox("box")
    fake.watch_events = [event(sandbox=sandbox("box", READY)), event(deleted="id-box")]
    result = await invoke(address, ["sandbox", "watch", "box", "-o", "json"])

    assert result.exit_code == 0
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert documents[0]["sandbox"]["status"]["phase"] == "SANDBOX_PHASE_READY"
    assert documents[1] == {"deleted": "id-box"}


async def test_pool_list_shows_hit_rates_and_misses_by_reason(fake: FakeSandboxService, address: str) -> None:
    fake.pools = pb.ListPoolsResponse(
        pools=[
            pb.Pool(
                name="env",
                workspace="default",
                fingerprint="f" * 64,
                desired=2,
                ready=2,
                idle=1,
                hits=3,
                misses=1,
            )
        ],
        misses_by_reason={"NoMatch": 4, "Ambiguous": 1},
    )
    result = await invoke(address, ["pool", "list"])

    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["env", "default", "f" * 12, "2/2/1", "3", "1", "75.0%", "-"]
    assert lines[2] == "Misses by reason: Ambiguous 1, NoMatch 4"


async def test_connection_flags_after_the_command_win(fake: FakeSandboxService, address: str) -> None:
    # The root --gateway points nowhere; the command's own --gateway is the one used.
    result = await invoke("unix:///nonexistent.sock", ["sandbox", "list", "--gateway", address])

    assert result.exit_code == 0
