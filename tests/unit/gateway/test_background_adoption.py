"""The gateway's side of background commands kept by supervisors (`gateway.background`): a new
session's hello is adopted within the bounds whatever it claims (a supervisor's word is not
trusted past them), under its pids and for its own sandbox only; output arrives by offset; a
command its supervisor no longer lists has ended; one whose session ended waits for the next."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import FailedPreconditionError, NotFoundError, ResourceExhaustedError
from warmshell.core.ids import SandboxId
from warmshell.core.models import Phase, SandboxRecord, SandboxStatus
from warmshell.gateway.background import _SWEEP_INTERVAL_MS, MAX_COMMAND_BYTES, BackgroundProcesses
from warmshell.gateway.execs import ExecRelay
from warmshell.gateway.sessions import SupervisorSession
from warmshell.sandboxio.outputring import EXITED_RETENTION_SECONDS, MAX_EXITED, MAX_RUNNING

A, B = SandboxId("sb-a"), SandboxId("sb-b")
HISTORY = 64


@pytest.fixture
async def table() -> AsyncIterator[BackgroundProcesses]:
    processes = BackgroundProcesses(ExecRelay(window_bytes=1024, stall_seconds=1.0), history_bytes=HISTORY)
    yield processes
    await processes.aclose()


def entry(pid: int, *, exec_id: str = "", exited: bool = False, **fields: object) -> spb.BackgroundExec:
    message = spb.BackgroundExec(pid=pid, exec_id=exec_id or f"e{pid}", command=["sleep", "9"], **fields)
    if exited:
        message.exited.CopyFrom(spb.ExecExited(exec_id=message.exec_id, exit_code=0))
        message.ended_at_ms = pid
    return message


def follows(session: SupervisorSession) -> list[spb.ExecFollow]:
    sent = []
    while not session.outbox.empty():
        message = session.outbox.get_nowait()
        if message is not None and message.WhichOneof("message") == "exec_follow":
            sent.append(message.exec_follow)
    return sent


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_forged_hello_is_taken_within_the_bounds_only(table: BackgroundProcesses) -> None:
    session = SupervisorSession(A, "i", "s1")
    forged = [entry(pid) for pid in range(1, 41)]
    forged += [entry(pid, exited=True) for pid in range(100, 140)]
    forged += [
        entry(1, exec_id="again"),  # a pid twice
        entry(200, exec_id="e1"),  # an exec id twice
        entry(0),  # no pid
        entry(2**31 + 5),  # past a pid's range
        entry(201, exec_id="x" * 65),  # not an exec id of the gateway's
        spb.BackgroundExec(pid=202, exec_id="long", command=["y" * 1024] * 1024),
    ]
    hello = spb.SupervisorHello(sandbox_id=A, background=forged, background_last_pid=2**32 - 1)
    table.adopt(session, hello)
    listed = table.list(A)
    # The first MAX_RUNNING running and the latest MAX_EXITED exited; an exited one is followed
    # (its output, then its exit) like the rest.
    expected = [*range(1, MAX_RUNNING + 1), *range(140 - MAX_EXITED, 140)]
    assert [p.pid for p in listed] == expected
    assert [f.exec_id for f in follows(session)] == [p.exec_id for p in listed]
    # Another sandbox sees none of them, and no pid of A names anything in B.
    assert table.list(B) == []
    with pytest.raises(NotFoundError, match="pid"):
        table.get(B, 1)


async def test_pids_go_on_from_the_highest_claimed(table: BackgroundProcesses) -> None:
    request = pb.StartProcessRequest(start=pb.ExecStreamStart(exec=pb.ExecSandboxRequest()))
    session = SupervisorSession(A, "i", "s1")
    table.adopt(session, spb.SupervisorHello(background=[entry(5)], background_last_pid=9))
    assert table.start(A, session, request).pid == 10
    table.adopt(SupervisorSession(B, "i", "s2"), spb.SupervisorHello(background_last_pid=2**32 - 1))
    with pytest.raises(ResourceExhaustedError, match="every background pid"):
        table.start(B, SupervisorSession(B, "i", "s2"), request)
    assert table.start(A, session, request).pid == 11  # one sandbox's claims are its own


async def test_a_long_command_is_cut_for_display(table: BackgroundProcesses) -> None:
    session = SupervisorSession(A, "i", "s1")
    table.adopt(
        session, spb.SupervisorHello(background=[spb.BackgroundExec(pid=1, exec_id="e", command=["y" * 1024] * 1024)])
    )
    [process] = table.list(A)
    assert sum(len(a) for a in process.command) <= MAX_COMMAND_BYTES


async def test_output_arrives_by_offset_and_a_replay_is_not_held_twice(table: BackgroundProcesses) -> None:
    session = SupervisorSession(A, "i", "s1")
    table.adopt(session, spb.SupervisorHello(background=[entry(1, output_start=10)]))
    [follow] = follows(session)
    assert follow.offset == 10  # what the supervisor dropped before this gateway saw it
    for offset, data in ((10, b"abcd"), (12, b"cdef"), (1000, b"zz")):
        session.deliver(spb.OutputData(exec_id="e1", data=data, offset=offset))
    await settle()
    [process] = table.list(A)
    assert (process.ring.start, process.ring.end) == (1000, 1002)
    dropped, chunks = process.ring.read(0)
    assert (dropped, b"".join(c.data for c in chunks)) == (1000, b"zz")


async def test_a_command_waits_for_the_next_session_and_ends_if_its_supervisor_lost_it(
    table: BackgroundProcesses,
) -> None:
    first = SupervisorSession(A, "i", "s1")
    table.adopt(first, spb.SupervisorHello(background=[entry(1), entry(2)]))
    first.close()
    await settle()
    one, two = table.list(A)
    assert one.running  # between sessions: still running
    assert one.session is None
    second = SupervisorSession(A, "i", "s2")
    table.adopt(second, spb.SupervisorHello(background=[entry(1)]))  # a restarted supervisor lost pid 2
    await settle()
    assert one.running
    assert one.session is second
    assert not two.running
    assert isinstance(two.failure, FailedPreconditionError)
    second.close()
    await settle()
    [ended, _] = table.list(A, over=True)  # the sandbox ended while nobody followed it
    assert not ended.running
    assert "sandbox ended" in str(ended.failure)


async def test_a_sandbox_is_forgotten_once_its_session_closed_and_nothing_is_kept(
    table: BackgroundProcesses,
) -> None:
    """No entry per sandbox outlives both its commands and its session (a gateway that served
    millions of sandboxes holds nothing for the ended ones); the next session's hello restores
    where its pids stood."""
    session = SupervisorSession(A, "i", "s1")
    table.adopt(session, spb.SupervisorHello(background_last_pid=7))
    assert table.list(A) == []
    assert A in table._sandboxes
    session.close()
    table.list(A)
    assert A not in table._sandboxes
    later = SupervisorSession(A, "i", "s2")
    table.adopt(later, spb.SupervisorHello(background_last_pid=7))
    request = pb.StartProcessRequest(start=pb.ExecStreamStart(exec=pb.ExecSandboxRequest()))
    assert table.start(A, later, request).pid == 8


async def test_the_commands_of_a_sandbox_that_ended_end_with_it(table: BackgroundProcesses) -> None:
    """Whether its session ended first or not, and whichever way the sandbox ended; a sandbox
    being deleted is forgotten. Commands whose supervisor never comes back (a sandbox deleted
    through another replica) end after the retention."""
    now = [1_000]
    clocked = BackgroundProcesses(
        ExecRelay(window_bytes=1024, stall_seconds=1.0), history_bytes=HISTORY, clock=lambda: now[0]
    )
    record = SandboxRecord(id=A, name="a", status=SandboxStatus(phase=Phase.READY))
    for phase in (Phase.EXITED, Phase.DELETING):
        session = SupervisorSession(A, "i", f"s-{phase}")
        hello = spb.SupervisorHello(background=[entry(1, exec_id=f"{phase}1"), entry(2, exec_id=f"{phase}2")])
        clocked.adopt(session, hello)  # new exec ids: what the first round ended is listed too
        first, second = [p for p in clocked.list(A) if p.running]
        session.execs.pop(first.exec_id)  # pid 1 stays attached; pid 2's session ended
        session.close()
        await settle()
        clocked.observe(record)
        assert first.running
        clocked.observe(record.model_copy(update={"status": SandboxStatus(phase=phase)}))
        assert not first.running
        assert not second.running
        assert "sandbox ended" in str(first.failure)
    assert clocked.list(A) == []
    session = SupervisorSession(B, "i", "s9")
    clocked.adopt(session, spb.SupervisorHello(background=[entry(1)]))
    session.close()
    await settle()
    now[0] += EXITED_RETENTION_SECONDS * 1000 + 1
    [gone] = clocked.list(B)
    assert "never came back" in str(gone.failure)
    await clocked.aclose()


async def test_the_other_sandboxes_are_pruned_in_a_sweep_every_interval() -> None:
    """A call prunes the sandbox at hand at once; the others (whose supervisor never came back,
    whose session closed) within one sweep interval, not on every call."""
    now = [1_000]
    clocked = BackgroundProcesses(
        ExecRelay(window_bytes=1024, stall_seconds=1.0), history_bytes=HISTORY, clock=lambda: now[0]
    )
    lost = SupervisorSession(B, "i", "s-lost")
    clocked.adopt(lost, spb.SupervisorHello(background=[entry(1)]))
    lost.close()
    await settle()
    [command] = clocked.list(B)
    now[0] += EXITED_RETENTION_SECONDS * 1000 + 1
    clocked.adopt(SupervisorSession(A, "i", "s-a"), spb.SupervisorHello())  # sweeps: the first call past the interval
    assert not command.running
    assert "never came back" in str(command.failure)
    other = SandboxId("sb-other")
    gone = SupervisorSession(other, "i", "s-gone")
    clocked.adopt(gone, spb.SupervisorHello())
    gone.close()
    clocked.list(A)
    assert other in clocked._sandboxes  # within the interval: only the sandbox at hand
    now[0] += _SWEEP_INTERVAL_MS
    clocked.list(A)
    assert other not in clocked._sandboxes
    await clocked.aclose()
