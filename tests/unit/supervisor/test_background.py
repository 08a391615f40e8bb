"""The supervisor's background commands (`supervisor.background`), with a scripted runner: output
goes into the ring whether or not a session follows; a follower sends from an offset, paced by
its window, then the exit; a new session's hello lists what is kept; the bounds hold."""

from __future__ import annotations

import asyncio

import pytest

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.config import GatewayConfig
from warmshell.sandboxio.interactive import ExecInput
from warmshell.sandboxio.outputring import MAX_EXITED, MAX_RUNNING
from warmshell.sandboxio.processes import OutputSink
from warmshell.supervisor.background import MAX_HISTORY_BYTES, BackgroundExecs


class Script:
    """A runner whose commands write what the test feeds them and exit when told."""

    def __init__(self) -> None:
        self.sinks: dict[str, OutputSink] = {}
        self.ends: dict[str, asyncio.Future[int]] = {}

    async def __call__(self, start: spb.ExecStart, sink: OutputSink, stdin: ExecInput | None) -> spb.ExecExited:
        self.sinks[start.exec_id] = sink
        self.ends[start.exec_id] = asyncio.get_running_loop().create_future()
        code = await self.ends[start.exec_id]
        return spb.ExecExited(exec_id=start.exec_id, exit_code=code)


class Sent:
    def __init__(self) -> None:
        self.messages: list[spb.SupervisorMessage] = []

    async def __call__(self, message: spb.SupervisorMessage) -> None:
        self.messages.append(message)

    def output(self, exec_id: str) -> list[tuple[int, bytes]]:
        return [(m.output.offset, m.output.data) for m in self.messages if m.output.exec_id == exec_id]

    def exits(self) -> list[spb.ExecExited]:
        return [m.exec_exited for m in self.messages if m.WhichOneof("message") == "exec_exited"]


def start(pid: int, *, window: int = 1000, history: int = 8) -> spb.ExecStart:
    return spb.ExecStart(
        exec_id=f"e{pid}", command=["cmd", str(pid)], background=True, background_pid=pid,
        history_bytes=history, output_window_bytes=window,
    )  # fmt: skip


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_output_is_kept_between_sessions_and_followed_from_an_offset() -> None:
    script, sent = Script(), Sent()
    table = BackgroundExecs(script, sent)
    await table.start(start(1), None)
    await settle()
    await script.sinks["e1"](False, b"abc")
    await settle()
    assert sent.output("e1") == [(0, b"abc")]
    table.end_session()  # nobody follows: the command writes on into the ring (8 bytes)
    await script.sinks["e1"](False, b"defghij")
    await settle()
    assert sent.output("e1") == [(0, b"abc")]
    [listed] = table.hello()
    assert (listed.pid, listed.exec_id, list(listed.command), listed.output_start) == (1, "e1", ["cmd", "1"], 2)
    # The next session had 3 bytes: it gets the rest the ring holds, from offset 3.
    assert table.follow("e1", 3, 1000)
    await settle()
    assert sent.output("e1")[1:] == [(3, b"defghij")]
    script.ends["e1"].set_result(5)
    await settle()
    assert [(e.exec_id, e.exit_code) for e in sent.exits()] == [("e1", 5)]
    assert table.hello()[0].exited.exit_code == 5
    assert not table.follow("nope", 0, 1000)
    await table.aclose()


async def test_a_follower_sends_no_more_than_its_window_until_credited() -> None:
    script, sent = Script(), Sent()
    table = BackgroundExecs(script, sent)
    await table.start(start(1, window=4, history=64), None)
    await settle()
    await script.sinks["e1"](True, b"0123456789")  # never waits for the follower
    await settle()
    assert sent.output("e1") == [(0, b"0123")]
    assert table.credit("e1", 4)
    await settle()
    assert sent.output("e1") == [(0, b"0123"), (4, b"4567")]
    table.end_session()
    assert not table.credit("e1", 4)  # nobody follows now
    await table.aclose()


async def test_the_bounds_running_exited_and_pids_never_reused() -> None:
    now = [0]
    script, sent = Script(), Sent()
    table = BackgroundExecs(script, sent, clock=lambda: now[0])
    for pid in range(1, MAX_RUNNING + 2):
        await table.start(start(pid), None)
    await settle()
    assert len(table.hello()) == MAX_RUNNING
    assert "already runs" in sent.exits()[-1].error
    for pid in range(1, MAX_RUNNING + 1):
        now[0] += 1
        script.ends[f"e{pid}"].set_result(0)
        await settle()
    assert [e.pid for e in table.hello()] == list(range(MAX_RUNNING - MAX_EXITED + 1, MAX_RUNNING + 1))
    await table.start(start(3), None)  # a pid used before, though its command is gone
    assert "already used" in sent.exits()[-1].error
    now[0] += 3600 * 1000 + 1
    assert table.hello() == []
    assert table.last_pid == MAX_RUNNING  # the refused one never ran
    await table.aclose()


@pytest.mark.parametrize("history", [0, 1 << 30])
async def test_a_ring_size_out_of_bounds_is_refused(history: int) -> None:
    sent = Sent()
    await BackgroundExecs(Script(), sent).start(start(1, history=history), None)
    assert sent.exits()[0].error.startswith("history_bytes: ")


def test_every_ring_size_a_gateway_may_ask_for_is_accepted() -> None:
    bounds = GatewayConfig.model_fields["exec_history_bytes"].metadata
    assert max(b.le for b in bounds if hasattr(b, "le")) == MAX_HISTORY_BYTES


async def test_a_command_waits_for_the_session_following_it_never_without_one() -> None:
    """Output the following session has not sent yet is not pushed out of the ring: the command
    waits (as for a foreground exec's window), until the session takes it or goes away."""
    script, sent = Script(), Sent()
    table = BackgroundExecs(script, sent)
    await table.start(start(1, window=4, history=8), None)
    await settle()
    sink = script.sinks["e1"]
    await sink(False, b"0123")
    await sink(False, b"456789")  # the follower has sent 4 of 10: room for these
    await settle()
    blocked = asyncio.ensure_future(sink(False, b"abcd"))  # would push out "45" unsent
    await settle()
    assert not blocked.done()
    table.credit("e1", 4)
    await asyncio.wait_for(blocked, 1.0)
    table.credit("e1", 8)
    await settle()
    assert b"".join(data for _, data in sent.output("e1")) == b"0123456789abcd"  # nothing dropped
    table.end_session()  # nobody follows: the command never waits, the ring drops the oldest
    await asyncio.wait_for(sink(False, b"x" * 100), 1.0)
    assert table.follow("e1", 14, 1)
    await settle()
    blocked_then_freed = asyncio.ensure_future(sink(False, b"y" * 8))
    await settle()
    assert not blocked_then_freed.done()
    table.end_session()  # the session went away while the command waited
    await asyncio.wait_for(blocked_then_freed, 1.0)
    await table.aclose()
