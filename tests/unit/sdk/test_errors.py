"""The SDK's one map from gRPC statuses to named exceptions, and the translation of real
RpcErrors raised by a call."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from warmshell.sdk import errors

NAMED = {
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: errors.InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.ABORTED: errors.Conflict,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
}


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK])
def test_every_failure_status_maps_to_an_sdk_error(code: grpc.StatusCode) -> None:
    error = errors.error_for(code.name, "it broke", address="unix:///x")
    assert isinstance(error, errors.ApiError)
    assert isinstance(error, errors.Error)
    assert type(error) is NAMED.get(code, errors.ApiError)
    assert error.code == code.name
    assert "it broke" in str(error)


def test_invalid_argument_carries_the_field_and_the_rule() -> None:
    error = errors.error_for("INVALID_ARGUMENT", "ttl_seconds: at most 3600 (the gateway's maximum)")
    assert isinstance(error, errors.InvalidArgument)
    assert error.field == "ttl_seconds"
    assert error.rule == "at most 3600 (the gateway's maximum)"
    bare = errors.error_for("INVALID_ARGUMENT", "no field named")
    assert isinstance(bare, errors.InvalidArgument)
    assert (bare.field, bare.rule) == ("", "no field named")


def test_unavailable_and_unauthenticated_say_what_to_do() -> None:
    down = errors.error_for("UNAVAILABLE", "connect failed", address="unix:///s.sock")
    assert str(down).startswith("gateway at unix:///s.sock is unavailable: connect failed")
    assert "warmshell gateway start" in down.hint
    refused = errors.error_for("UNAUTHENTICATED", "bad token")
    assert "WARMSHELL_API_TOKEN" in refused.hint
    assert isinstance(errors.error_for("DEADLINE_EXCEEDED", ""), TimeoutError)


@pytest.mark.parametrize(
    "details",
    [
        "Stream removed (RST_STREAM (Received RST_STREAM with error code 7))",  # grpcio
        "the stream was reset (HTTP/2 error 7)",  # the HTTP/2 transport
    ],
)
def test_a_refused_stream_says_the_call_was_not_started_and_may_be_retried(details: str) -> None:
    refused = errors.error_for("UNAVAILABLE", details, address="127.0.0.1:7443")
    assert isinstance(refused, errors.Unavailable)
    assert refused.details == (
        "the gateway at 127.0.0.1:7443 refused the call: this connection already carries as many "
        "concurrent calls as it allows; the call was not started, so it is safe to retry"
    )
    assert "fewer calls at once" in refused.hint


def test_other_resets_are_not_taken_for_a_refusal() -> None:
    for details in ("Received RST_STREAM with error code 2", "the stream was reset (HTTP/2 error 70)"):
        assert "refused the call" not in errors.error_for("UNAVAILABLE", details).details


def test_a_real_rpc_failure_is_translated_never_raw(tmp_path: Path) -> None:
    address = f"unix://{tmp_path}/none.sock"
    channel = grpc.insecure_channel(address)
    try:
        call = channel.unary_unary("/warmshell.v1.SandboxService/GetSandbox")
        with pytest.raises(errors.Unavailable) as caught, errors.translating(address):
            call(b"", timeout=5)
    finally:
        channel.close()
    assert f"no gateway socket at {tmp_path}/none.sock" in str(caught.value)
    assert not isinstance(caught.value, grpc.RpcError)
