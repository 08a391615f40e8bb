"""One session per sandbox: a healthy session is never superseded; a silent or closed one is."""

from __future__ import annotations

import pytest

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import AlreadyExistsError, UnavailableError
from warmshell.core.ids import SandboxId
from warmshell.gateway.sessions import ExecChannel, SessionTable, SupervisorSession

SB = SandboxId("sbx-1")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def test_a_second_session_is_refused_while_the_first_is_healthy() -> None:
    clock = Clock()
    table = SessionTable(window_ms=3000, clock=clock)
    first = table.open(SB, "i-1")
    clock.now += 2999
    with pytest.raises(AlreadyExistsError, match="already has a live supervisor session"):
        table.open(SB, "i-1")
    assert table.get(SB) is first
    assert not first.closed.is_set()


def test_a_session_that_went_silent_is_superseded() -> None:
    clock = Clock()
    table = SessionTable(window_ms=3000, clock=clock)
    first = table.open(SB, "i-1")
    clock.now += 3001
    assert table.live(SB) is None
    second = table.open(SB, "i-1")
    assert table.get(SB) is second
    assert first.closed.is_set()


def test_a_heartbeat_keeps_a_session_healthy() -> None:
    clock = Clock()
    table = SessionTable(window_ms=3000, clock=clock)
    first = table.open(SB, "i-1")
    clock.now += 2500
    first.last_seen = clock.now
    clock.now += 2500
    assert table.live(SB) is first


def test_a_closed_session_does_not_block_the_next() -> None:
    table = SessionTable(window_ms=3000)
    first = table.open(SB, "i-1")
    assert table.close_if_current(first)
    assert table.live(SB) is None
    assert table.open(SB, "i-1") is not first


def test_an_ended_session_tells_its_supervisor_to_stop_and_leaves_the_table() -> None:
    table = SessionTable(window_ms=3000)
    session = table.open(SB, "i-1")
    table.end(SB, "the sandbox was deleted")
    table.end(SB, "the sandbox was deleted")  # none left: nothing more is sent
    sent = [session.outbox.get_nowait() for _ in range(session.outbox.qsize())]
    assert sent == [spb.GatewayMessage(shutdown=spb.Shutdown(reason="the sandbox was deleted", reconnect=False)), None]
    assert table.get(SB) is None


def test_sessions_of_other_sandboxes_do_not_interfere() -> None:
    table = SessionTable(window_ms=3000)
    table.open(SB, "i-1")
    table.open(SandboxId("sbx-2"), "i-2")
    assert len(table) == 2


def test_exec_output_within_the_window_is_queued_and_granted_back_per_quarter() -> None:
    session = SupervisorSession(SandboxId("sb-1"), "i-1", "s1")
    channel = ExecChannel("e1", window=1000)
    session.execs["e1"] = channel
    for _ in range(4):
        session.deliver(spb.OutputData(exec_id="e1", data=b"x" * 250))
    assert channel.events.qsize() == 4
    assert channel.in_flight == 1000
    assert [channel.passed_on(100), channel.passed_on(150), channel.passed_on(250)] == [0, 250, 250]
    assert channel.in_flight == 500


def test_exec_output_beyond_the_window_fails_the_exec_and_cancels_it() -> None:
    session = SupervisorSession(SandboxId("sb-1"), "i-1", "s1")
    channel = ExecChannel("e1", window=100)
    session.execs["e1"] = channel
    session.deliver(spb.OutputData(exec_id="e1", data=b"x" * 100))
    session.deliver(spb.OutputData(exec_id="e1", data=b"y"))
    assert channel.events.get_nowait().data == b"x" * 100
    ended = channel.events.get_nowait()
    assert isinstance(ended, spb.ExecExited)
    assert "100-byte output window" in ended.error
    assert "e1" not in session.execs
    assert session.outbox.get_nowait().exec_cancel.exec_id == "e1"


def test_execs_of_a_session_closed_by_a_stopping_gateway_end_with_its_error() -> None:
    table = SessionTable()
    sessions = [table.open(SandboxId(f"sb-{n}"), "i-1") for n in range(2)]
    channels = [ExecChannel(f"e{n}") for n in range(2)]
    for session, channel in zip(sessions, channels, strict=True):
        session.execs[channel.exec_id] = channel
    table.close_all("gateway shutting down", ends_execs=lambda: UnavailableError("gateway stopping"))
    ended = [channel.events.get_nowait() for channel in channels]
    assert all(isinstance(error, UnavailableError) and str(error) == "gateway stopping" for error in ended)
    assert ended[0] is not ended[1], "each exec gets its own error (raised in its own task)"
    for session in sessions:
        assert session.outbox.get_nowait() == spb.GatewayMessage(
            shutdown=spb.Shutdown(reason="gateway shutting down", reconnect=True)
        )


def test_execs_of_a_session_closed_otherwise_end_as_session_closed() -> None:
    session = SupervisorSession(SandboxId("sb-1"), "i-1", "s1")
    channel = ExecChannel("e1")
    session.execs["e1"] = channel
    session.close("superseded by a newer session")
    ended = channel.events.get_nowait()
    assert isinstance(ended, spb.ExecExited)
    assert (ended.exit_code, ended.error) == (-1, "session closed")
