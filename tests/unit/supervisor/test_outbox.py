"""The supervisor's outbox: output waits for room once its byte bound is queued; other messages
never wait; a reader of an old session takes nothing."""

from __future__ import annotations

import asyncio

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.supervisor.outbox import Outbox


def output(data: bytes) -> spb.SupervisorMessage:
    return spb.SupervisorMessage(output=spb.OutputData(data=data))


HELLO = spb.SupervisorMessage(hello=spb.SupervisorHello(sandbox_id="s"))


async def test_output_waits_for_room_and_control_messages_do_not() -> None:
    outbox = Outbox(max_bytes=100)
    await outbox.put(output(b"a" * 60))
    await outbox.put(output(b"b" * 60))  # under the bound when it was put: admitted
    blocked = asyncio.ensure_future(outbox.put(output(b"c" * 10)))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    assert outbox.queued_bytes == 120
    exited = spb.SupervisorMessage(workload_exited=spb.WorkloadExited(exit_code=0))
    await asyncio.wait_for(outbox.put(exited), 1.0)  # never waits

    reader = outbox.stream(outbox.new_session(), HELLO)
    assert await anext(reader) == HELLO
    assert (await anext(reader)).output.data == b"a" * 60
    await asyncio.wait_for(blocked, 1.0)  # 60 bytes queued now: room again
    rest = [await anext(reader) for _ in range(3)]
    assert [m.WhichOneof("message") for m in rest] == ["output", "workload_exited", "output"]
    assert outbox.queued_bytes == 0


async def test_an_old_session_takes_nothing() -> None:
    outbox = Outbox()
    old = outbox.stream(outbox.new_session(), HELLO)
    assert await anext(old) == HELLO
    waiting = asyncio.ensure_future(anext(old))
    outbox.new_session()
    await outbox.put(output(b"x"))
    try:
        await asyncio.wait_for(waiting, 1.0)
        raise AssertionError("the old session's reader took a message")
    except StopAsyncIteration:
        pass
    current = outbox.stream(outbox.new_session(), HELLO)
    await anext(current)
    assert (await anext(current)).output.data == b"x"


async def test_a_new_session_drops_what_was_queued_for_the_old_sessions_execs() -> None:
    """The gateway ended those execs with their session; a background command's output is sent
    again from its ring to the session that follows it. The workload's own output stays."""
    outbox = Outbox(max_bytes=100)
    await outbox.put(spb.SupervisorMessage(output=spb.OutputData(exec_id="e", data=b"x" * 120)))
    blocked = asyncio.ensure_future(outbox.put(output(b"workload")))
    exited = spb.SupervisorMessage(exec_exited=spb.ExecExited(exec_id="e"))
    outbox.put_control(spb.SupervisorMessage(exec_input_credit=spb.ExecInputCredit(exec_id="e", bytes=1)))
    await outbox.put(exited)
    await asyncio.sleep(0.01)
    assert not blocked.done()
    reader = outbox.stream(outbox.new_session(), HELLO)
    await asyncio.wait_for(blocked, 1.0)  # the exec's output no longer holds the room
    assert await anext(reader) == HELLO
    assert (await anext(reader)).output == spb.OutputData(data=b"workload")
    assert outbox.queued_bytes == 0
