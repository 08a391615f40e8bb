"""The SDK's HTTP/2 transport against the real gateway (grpcio's server): statuses, deadlines,
the token, streaming, messages past the flow-control windows, and a gateway that goes away.

The SDK's sync tests run on both transports too (see conftest); these are the cases where the
light client does work of its own (flow control, deadlines, connection handling).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import warmshell
from tests.helpers.cli import CliGateway, start_gateway
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.sdk import errors, http2
from warmshell.sdk.transport import GrpcTransport, Http2Transport, open_transport


@pytest.fixture
def h2(gateway: CliGateway, monkeypatch: pytest.MonkeyPatch) -> Iterator[warmshell.Client]:
    monkeypatch.delenv("WARMSHELL_TRANSPORT", raising=False)
    client = warmshell.Client(state_dir=gateway.state_dir, transport="http2")
    yield client
    for info in client.list(all_workspaces=True):
        client.get(info.name, workspace=info.workspace).delete()
    client.close()


def test_the_http2_transport_is_used_for_a_unix_socket_and_grpcio_otherwise(
    h2: warmshell.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(h2._transport, Http2Transport)
    assert isinstance(open_transport("localhost:1", "http2"), GrpcTransport)  # TCP: grpcio
    monkeypatch.setenv("WARMSHELL_TRANSPORT", "grpcio")
    assert isinstance(open_transport(h2.address, "http2"), GrpcTransport)  # the override wins
    monkeypatch.setenv("WARMSHELL_TRANSPORT", "carrier-pigeon")
    with pytest.raises(errors.InvalidArgument, match="WARMSHELL_TRANSPORT"):
        open_transport(h2.address, "http2")


def test_statuses_and_messages_match_grpcio(h2: warmshell.Client, gateway: CliGateway) -> None:
    seen = []
    with warmshell.Client(state_dir=gateway.state_dir, transport="grpcio") as grpcio:
        for client in (h2, grpcio):
            with pytest.raises(errors.NotFound) as missing:
                client.get("no-such-box")
            with pytest.raises(errors.InvalidArgument) as invalid:
                client.create(name="Not_A_Label")
            seen.append((missing.value.details, invalid.value.field, invalid.value.rule))
    assert seen[0] == seen[1]
    details, field, rule = seen[0]
    assert "no-such-box" in details
    assert field == "name"
    assert rule


def test_the_token_is_sent_and_checked(gateway: CliGateway) -> None:
    for token in ("wrong", None):
        # No token at all: an empty state directory has no api-token file to fall back on.
        state = gateway.state_dir if token else Path("/nonexistent")
        client = warmshell.Client(f"unix://{gateway.state_dir}/gateway.sock", token, state_dir=state, transport="http2")
        with client, pytest.raises(errors.Unauthenticated):
            client.list()


def test_a_deadline_ends_a_stream_that_would_go_on(h2: warmshell.Client) -> None:
    sb = h2.create(name="deadline")
    started = time.monotonic()
    request = pb.WatchSandboxRequest(name=sb.name, workspace=sb.workspace)  # never stops by itself
    with pytest.raises(errors.DeadlineExceeded):
        for _ in h2.service.watch_sandbox(request, timeout=0.5):
            pass
    assert 0.4 < time.monotonic() - started < 10
    assert h2.get(sb.name).name == sb.name  # the client still works afterwards


def test_output_far_past_the_windows_arrives_whole_and_in_order(h2: warmshell.Client) -> None:
    sb = h2.create(name="bulk")
    script = "i=0; while [ $i -lt 200000 ]; do echo $i; i=$((i+1)); done"  # ~1.3 MB in many chunks
    result = sb.run(["sh", "-c", script], timeout=60)
    assert result.exit_code == 0
    assert result.stdout.decode().split() == [str(i) for i in range(200_000)]


def test_a_request_past_the_peer_window_is_sent_in_pieces_and_an_oversized_one_refused(h2: warmshell.Client) -> None:
    sb = h2.create(name="big")
    # 700 kB of stdin: ten times HTTP/2's initial 64 KiB window, under the 1 MiB request limit;
    # `cat` sends it back, so the answer crosses the windows the other way too.
    data = bytes(range(256)) * 2800
    result = sb.run(["cat"], stdin=data, timeout=60)
    assert (result.exit_code, result.stdout) == (0, data)
    # Whole and parsed: the gateway names the rule the 600 kB environment breaks.
    with pytest.raises(errors.InvalidArgument, match=r"spec\.environment: 600003 bytes in total"):
        h2.create(name="env-too-big", env={"BIG": "x" * 600_000})
    with pytest.raises(errors.ResourceExhausted):
        sb.run(["cat"], stdin=b"x" * 1_200_000)  # over the gateway's 1 MiB request limit
    assert h2.get("big").name == "big"


def test_threads_share_one_client(h2: warmshell.Client) -> None:
    h2.create(name="shared")
    failures: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                assert h2.get("shared").name == "shared"
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert isinstance(h2._transport, Http2Transport)
    assert 1 <= len(h2._transport._idle) <= 8  # connections are reused, not one per call


def test_no_socket_and_a_dead_socket_are_unavailable(tmp_path: Path) -> None:
    missing = warmshell.Client(f"unix://{tmp_path}/none.sock", "t", transport="http2")
    with missing, pytest.raises(errors.Unavailable, match=f"no gateway socket at {tmp_path}/none.sock"):
        missing.list()
    stale = tmp_path / "stale.sock"
    stale.touch()
    dead = warmshell.Client(f"unix://{stale}", "t", transport="http2")
    with dead, pytest.raises(errors.Unavailable, match="is unavailable"):
        dead.list()


def test_a_gateway_killed_mid_stream_is_unavailable(tmp_path: Path) -> None:
    own = start_gateway(tmp_path / "state")
    try:
        with warmshell.Client(state_dir=own.state_dir, transport="http2") as client:
            sb = client.create(name="doomed")
            stream = client.service.watch_sandbox(pb.WatchSandboxRequest(name=sb.name), timeout=30)
            assert next(stream).WhichOneof("event") == "sandbox"
            own.process.send_signal(signal.SIGKILL)
            with pytest.raises(errors.Unavailable):
                for _ in stream:
                    pass
    finally:
        own.process.kill()
        own.process.wait()


def test_connections_are_reused_and_one_the_gateway_closed_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dials: list[str] = []
    connect = http2.connect_unix
    monkeypatch.setattr(http2, "connect_unix", lambda path, timeout: dials.append(path) or connect(path, timeout))
    first = start_gateway(tmp_path / "state")
    try:
        with warmshell.Client(state_dir=first.state_dir, transport="http2") as client:
            for _ in range(5):
                client.list()
            assert len(dials) < 5  # an idle connection carries the next call
            assert first.stop() == 0
            again = start_gateway(tmp_path / "state")  # a restart: the pooled connection is dead
            try:
                assert client.list() == []  # no spurious failure: the dead connection was dropped
            finally:
                assert again.stop() == 0
    finally:
        if first.process.poll() is None:
            first.process.kill()


def test_an_idle_pooled_connection_does_not_hold_a_gateway_stop(tmp_path: Path) -> None:
    # grpc's graceful stop sends GOAWAY and a PING and closes a connection once the PING is
    # answered: a pooled connection nobody reads would hold the stop for its whole grace.
    first = start_gateway(tmp_path / "state")
    try:
        with warmshell.Client(state_dir=first.state_dir, transport="http2") as client:
            assert client.list() == []
            assert isinstance(client._transport, Http2Transport)
            assert len(client._transport._idle) == 1  # the connection stays open, idle
            time.sleep(0.2)  # idle for a while, as between a program's calls
            started = time.monotonic()
            assert first.stop() == 0
            stopped_in = time.monotonic() - started
            # The grace calls in flight get is 5 s; a stop with none takes well under a second.
            assert stopped_in < 2.0, f"the stop took {stopped_in:.2f} s"
            started = time.monotonic()
            with pytest.raises(errors.Unavailable):
                client.list()  # no gateway: told so, not left waiting
            assert time.monotonic() - started < 2.0
            again = start_gateway(tmp_path / "state")
            try:
                assert client.list() == []  # the next call dials the restarted gateway
            finally:
                assert again.stop() == 0
    finally:
        if first.process.poll() is None:
            first.process.kill()
