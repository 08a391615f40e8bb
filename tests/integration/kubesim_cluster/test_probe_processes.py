"""An exec probe's process is the kubelet's to clean up: whether the probe passes, fails or is
cancelled with its pod, its asyncio transport is closed when the probe returns, so none is left
for the collector to report as unclosed in a later test (a CI failure twice)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubesim.kubelet import containers, probes


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[containers.PipedProcess]:
    seen: list[containers.PipedProcess] = []
    start = containers.start_piped

    async def recording(argv: list[str], **popen: Any) -> containers.PipedProcess:
        piped = await start(argv, **popen)
        seen.append(piped)
        return piped

    monkeypatch.setattr(containers, "start_piped", recording)
    return seen


def closed(piped: containers.PipedProcess) -> bool:
    return piped._transport.is_closing()


async def running_probe(started: list[containers.PipedProcess]) -> asyncio.Task[bool]:
    """An exec probe of a command that runs for 30 s, once its process has started."""
    probe = asyncio.create_task(probes._exec(["sleep", "30"], {}, "/"))
    async with asyncio.timeout(10):
        while not started:
            await asyncio.sleep(0.01)
    return probe


async def test_a_finished_probe_closes_its_process(started: list[containers.PipedProcess]) -> None:
    assert await probes._exec(["true"], {}, "/")
    assert not await probes._exec(["false"], {}, "/")
    assert [closed(p) for p in started] == [True, True]


async def test_a_cancelled_probe_kills_and_closes_its_process(started: list[containers.PipedProcess]) -> None:
    probe = await running_probe(started)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    [piped] = started
    assert closed(piped)
    assert piped.returncode == -9  # killed, and reaped


async def test_a_probe_cancelled_again_while_it_stops_its_process_still_closes_it(
    started: list[containers.PipedProcess],
) -> None:
    probe = await running_probe(started)
    probe.cancel()
    await asyncio.sleep(0)  # now in its clean-up, waiting for the killed process
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert closed(started[0])
    async with asyncio.timeout(10):  # killed: reaped here, so no later test sees it still running
        assert await started[0].wait() == -9
