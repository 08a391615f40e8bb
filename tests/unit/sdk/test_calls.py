"""The pure half of the SDK's calls: request building and the folds over streamed events."""

from __future__ import annotations

import pytest

from warmshell.api.v1 import outcome_pb2
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.models import Allocation, Phase
from warmshell.sdk import calls, errors, views


def _sandbox(phase: int, **status: object) -> pb.Sandbox:
    return pb.Sandbox(name="box", workspace="default", status=pb.SandboxStatus(phase=phase, **status))  # type: ignore[arg-type]


def test_create_request_leaves_unset_lifetimes_to_the_gateway() -> None:
    unset = calls.create_request(
        name=None, workspace="", image="", env=None, cpu="", memory="", command=None, labels=None,
        ttl_seconds=None, idle_timeout_seconds=None,
    )  # fmt: skip
    assert not unset.HasField("ttl_seconds")
    assert not unset.HasField("idle_timeout_seconds")
    given = calls.create_request(
        name="a", workspace="w", image="i", env={"A": "1"}, cpu="0.5", memory="1Gi", command=["true"],
        labels={"k": "v"}, ttl_seconds=0, idle_timeout_seconds=30,
    )  # fmt: skip
    assert given.HasField("ttl_seconds")
    assert (given.ttl_seconds, given.idle_timeout_seconds) == (0, 30)
    assert (given.name, given.workspace, list(given.spec.command)) == ("a", "w", ["true"])
    assert dict(given.spec.environment) == {"A": "1"}
    assert (given.spec.resources.cpu, given.spec.resources.memory, given.spec.resources.pids) == ("0.5", "1Gi", 0)


def test_no_command_goes_out_with_the_create_only_when_asked() -> None:
    assert not calls.create_request(name=None, workspace="", image="i").spec.no_command
    assert calls.create_request(name=None, workspace="", image="i", no_command=True).spec.no_command


def test_an_option_create_does_not_have_is_refused_not_ignored() -> None:
    with pytest.raises(TypeError, match="'enc'"):
        calls.create_request(name=None, workspace="", enc={"A": "1"})  # type: ignore[call-arg]


def test_pids_go_out_with_the_create_and_come_back_in_the_views() -> None:
    request = calls.create_request(
        name=None, workspace="", image="", env=None, cpu="", memory="", pids=64, command=None, labels=None,
        ttl_seconds=None, idle_timeout_seconds=None,
    )  # fmt: skip
    assert request.spec.resources.pids == 64
    sandbox = pb.Sandbox(name="b", spec=pb.SandboxSpec(resources=pb.Resources(pids=64)))
    assert views.sandbox_info(sandbox).pids == 64
    assert views.pool_info(pb.Pool(name="p", resources=pb.Resources(pids=128))).pids == 128


def test_argv_must_be_a_list_and_times_are_whole_seconds() -> None:
    with pytest.raises(TypeError, match="argv is an argv list"):
        calls.exec_request(name="b", workspace="", argv="echo hi", env=None, workdir=None, timeout=None, stdin=b"")
    request = calls.exec_request(name="b", workspace="", argv=["cat"], env=None, workdir="/tmp", timeout=1.2, stdin="x")
    assert (request.timeout_seconds, request.stdin, request.workdir) == (2, b"x", "/tmp")
    assert calls.exec_deadline(None) is None
    assert calls.exec_deadline(10) == 10 + calls.EXEC_DEADLINE_MARGIN_SECONDS
    with pytest.raises(errors.InvalidArgument) as caught:
        calls.create_request(
            name=None, workspace="", image="", env=None, cpu="", memory="", command=None, labels=None,
            ttl_seconds=-1, idle_timeout_seconds=None,
        )  # fmt: skip
    assert caught.value.field == "ttl_seconds"


def test_label_selector_refuses_what_the_wire_cannot_carry() -> None:
    assert calls.label_selector({"b": "2", "a": "1"}) == "a=1,b=2"
    assert calls.label_selector(None) == ""
    with pytest.raises(errors.InvalidArgument) as caught:
        calls.label_selector({"a": "x,y"})
    assert caught.value.field == "labels"


def test_ready_fold_ends_on_ready_or_exited_and_raises_on_failure() -> None:
    fold = calls.ReadyFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING))
    assert not fold.done()
    assert not fold.feed(pb.SandboxEvent(progress=pb.ProgressEvent(message="claimed")))
    assert fold.feed(pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_READY)))
    assert calls.ReadyFold(_sandbox(pb.SANDBOX_PHASE_EXITED, exit_code=0)).done()
    broken = _sandbox(
        pb.SANDBOX_PHASE_ERROR,
        conditions=[pb.Condition(type="Ready", status="False", reason="BackendFailed", message="bwrap: denied")],
    )
    with pytest.raises(errors.SandboxError) as caught:
        calls.ReadyFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING)).feed(pb.SandboxEvent(sandbox=broken))
    assert caught.value.reason == "BackendFailed"
    assert "bwrap: denied" in str(caught.value)
    assert caught.value.sandbox is not None
    assert caught.value.sandbox.phase is Phase.ERROR
    with pytest.raises(errors.SandboxError, match="was deleted"):
        calls.ReadyFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING)).feed(pb.SandboxEvent(deleted="id"))


def test_watch_fold_waits_for_what_the_caller_follows_and_never_past_a_deletion() -> None:
    ready, error = (
        pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_READY)),
        pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_ERROR)),
    )
    exited = pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_EXITED, exit_code=0))
    assert calls.WatchFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING)).feed(ready)
    assert calls.WatchFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING)).feed(error)  # not raised: the caller decides
    workload = calls.WatchFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING), until_exit=True)
    assert not workload.feed(ready)
    assert workload.feed(exited)
    assert workload.watch_request().stop_on_ready is False
    # Following output, the stream's end (after the last output) ends the wait, not the phase.
    followed = calls.WatchFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING), until_exit=True, follow_output=True)
    assert not followed.feed(error)
    assert not followed.feed(exited)
    assert followed.outcome() is calls.WaitOutcome.EXITED
    assert followed.feed(pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_DELETING)))
    gone = calls.WatchFold(_sandbox(pb.SANDBOX_PHASE_PROVISIONING), until_exit=True, follow_output=True)
    assert gone.feed(pb.SandboxEvent(deleted="id"))
    assert gone.outcome() is calls.WaitOutcome.FAILED
    assert "was deleted" in str(gone.failure())


def test_spec_differences_compare_only_what_is_given_and_amounts_not_spellings() -> None:
    existing = pb.Sandbox(
        name="b",
        workspace="w",
        labels={"k": "v"},
        spec=pb.SandboxSpec(
            image="img",
            environment={"A": "1"},
            secrets={"KEY": "<redacted>"},
            resources=pb.Resources(cpu="500m", memory="1Gi", pids=64),
            command=["sleep", "1"],
        ),
        lifetime=pb.Lifetime(ttl_seconds=60),
    )
    same: calls.CreateOptions = {
        "image": "img", "env": {"A": "1"}, "secrets": {"KEY": "other"}, "cpu": "0.5", "memory": "1073741824",
        "pids": 64, "command": ("sleep", "1"), "labels": {"k": "v"}, "ttl_seconds": 60, "idle_timeout_seconds": None,
    }  # fmt: skip
    assert calls.spec_differences(existing, same) == []
    assert calls.spec_differences(existing, {}) == []
    other: calls.CreateOptions = {"env": {}, "cpu": "1", "memory": "not-a-quantity", "ttl_seconds": 61, "image": ""}
    assert calls.spec_differences(existing, other) == ["env", "cpu", "memory", "ttl_seconds"]
    conflict = calls.spec_conflict(existing, ["env", "cpu"])
    assert isinstance(conflict, errors.Conflict)
    assert "sandbox w/b exists with a different env, cpu" in str(conflict)


def test_exit_fold_collects_output_and_needs_an_exit() -> None:
    fold = calls.ExitFold("box")
    fold.feed(pb.SandboxEvent(output=pb.OutputChunk(stream=pb.OutputChunk.STREAM_STDOUT, data=b"a")))
    fold.feed(pb.SandboxEvent(output=pb.OutputChunk(stream=pb.OutputChunk.STREAM_STDERR, data=b"e")))
    timeline = pb.Timeline(activated_us=1_000, exited_us=6_000)
    fold.feed(pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_EXITED, exit_code=3, timeline=timeline)))
    assert fold.result() == views.ExecResult(3, b"a", b"e", 5.0)
    unfinished = calls.ExitFold("box")
    unfinished.feed(pb.SandboxEvent(sandbox=_sandbox(pb.SANDBOX_PHASE_READY)))
    with pytest.raises(errors.SandboxError):
        unfinished.result()


def test_exec_fold_needs_an_exit_code() -> None:
    fold = calls.ExecFold()
    for event in (pb.ExecEvent(stdout=b"4"), pb.ExecEvent(stdout=b"2\n"), pb.ExecEvent(stderr=b"w")):
        fold.feed(event)
    with pytest.raises(errors.Error, match="without an exit code"):
        fold.result(1.0)
    fold.feed(pb.ExecEvent(exit_code=0))
    assert fold.result(1.5) == views.ExecResult(0, b"42\n", b"w", 1.5)
    assert calls.output_event(pb.ExecEvent(exit_code=0)) == views.OutputEvent(exit_code=0, outcome=views.ExecOutcome())


def test_the_outcome_comes_from_the_last_event_never_from_the_output() -> None:
    fold = calls.ExecFold()
    fold.feed(pb.ExecEvent(stderr=b"warmshell: timed out after 1s\n"))  # the command's own words
    fold.feed(pb.ExecEvent(exit_code=124))
    assert not fold.result(1.0).timed_out
    killed = pb.ExecEvent(exit_code=124, outcome=outcome_pb2.ExecOutcome(timed_out=True, signal=9))
    fold.feed(killed)
    result = fold.result(1.0)
    assert (result.timed_out, result.signal, result.error, result.ok) == (True, 9, None, False)
    event = calls.output_event(killed)
    assert (event.exit_code, event.timed_out, event.signal) == (124, True, 9)
    missing = outcome_pb2.ExecOutcome(
        error=outcome_pb2.EXEC_ERROR_COMMAND_NOT_FOUND, error_message="x: command not found"
    )
    assert views.exec_outcome(missing) == views.ExecOutcome(
        error=views.ExecError.COMMAND_NOT_FOUND, error_message="x: command not found"
    )
    newer = outcome_pb2.ExecOutcome(error=99)  # type: ignore[arg-type]  # a code a newer gateway may send
    assert views.exec_outcome(newer).error is views.ExecError.NOT_EXECUTABLE


def test_check_result_raises_command_failed_or_timeout_with_the_tail_of_stderr() -> None:
    assert errors.check_result(["true"], views.ExecResult(0, b"", b"", 1.0)).ok
    noisy = b"x" * 5000 + b"\nerror: the last line\n"
    with pytest.raises(errors.CommandFailed, match="'make test' exited 2; stderr ends:") as failed:
        errors.check_result(["make", "test"], views.ExecResult(2, b"", noisy, 1.0))
    assert failed.value.exit_code == 2
    assert failed.value.stderr_tail.endswith("error: the last line")
    assert len(failed.value.stderr_tail) <= errors.STDERR_TAIL_BYTES
    timed_out = views.ExecResult(124, b"", b"", 1.0, views.ExecOutcome(timed_out=True, signal=9))
    with pytest.raises(errors.CommandTimeout, match="timed out") as timeout:
        errors.check_result(["sleep", "9"], timed_out)
    assert isinstance(timeout.value, errors.CommandFailed | TimeoutError)
    never = views.ExecResult(
        127,
        b"",
        b"",
        1.0,
        views.ExecOutcome(error=views.ExecError.COMMAND_NOT_FOUND, error_message="nope: command not found"),
    )
    with pytest.raises(errors.CommandFailed, match="never started: nope: command not found"):
        errors.check_result(["nope"], never)


def test_sandbox_info_is_a_plain_snapshot() -> None:
    message = pb.Sandbox(
        id="i", name="n", workspace="w", labels={"k": "v"},
        spec=pb.SandboxSpec(command=["sleep", "1"], resources=pb.Resources(cpu="500m", memory="256Mi")),
        status=pb.SandboxStatus(phase=pb.SANDBOX_PHASE_READY, allocation="warm", pool="default",
                                timeline=pb.Timeline(requested_us=1_000, ready_us=3_500)),
        lifetime=pb.Lifetime(ttl_seconds=60, expires_at_ms=1_800_000_000_000, idle_timeout_seconds=5),
    )  # fmt: skip
    info = views.sandbox_info(message)
    assert (info.phase, info.allocation, info.pool, info.exit_code) == (Phase.READY, Allocation.WARM, "default", None)
    assert info.timeline.ready_ms == 2.5
    assert info.command == ("sleep", "1")
    assert info.lifetime.expires_at is not None
    assert info.lifetime.expires_at.timestamp() == 1_800_000_000
    assert (info.lifetime.ttl_seconds, info.lifetime.idle_timeout_seconds) == (60, 5)
    assert views.sandbox_info(pb.Sandbox()).lifetime.expires_at is None


def test_ask_ready_waits_in_the_create_and_answers_before_its_deadline() -> None:
    request = pb.CreateSandboxRequest()
    assert calls.ask_ready(request, ready_timeout=2.5, call_timeout=60.0) == 62.5
    assert (request.wait_ready, request.ready_timeout_ms) == (True, 2500)
    # No ready timeout: the create itself still answers within the call's own timeout.
    request = pb.CreateSandboxRequest()
    assert calls.ask_ready(request, ready_timeout=None, call_timeout=60.0) == 120.0
    assert request.ready_timeout_ms == 60_000
    request = pb.CreateSandboxRequest()
    assert calls.ask_ready(request, ready_timeout=None, call_timeout=None) is None
    assert (request.wait_ready, request.ready_timeout_ms) == (True, 0)
    request = pb.CreateSandboxRequest()
    calls.ask_ready(request, ready_timeout=1e12, call_timeout=None)
    assert request.ready_timeout_ms == 2**32 - 1


def test_remaining_is_what_is_left_and_never_zero() -> None:
    import time

    assert calls.remaining(None, time.monotonic()) is None
    assert 9.0 < (calls.remaining(10.0, time.monotonic() - 0.5) or 0) <= 9.5
    assert calls.remaining(1.0, time.monotonic() - 5) == 0.001
