"""A helper process the kubelet kills by closing it (a network namespace holder whose pod's stop
was cancelled, a fork server, a probe) is reaped before the kubelet's loop goes.

Its exit status reaches asyncio by a callback on the loop; when the loop closed first, the
child's `Popen` kept no status and was reported "subprocess N is still running" when collected,
in whatever test ran then (a CI failure in test_cluster_timing)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from kubesim.cluster import running_cluster
from kubesim.kubelet import containers

SLEEPER = ["sleep", "30"]


def test_a_helper_killed_on_close_is_reaped_before_its_loop_closes() -> None:
    helpers: list[containers.PipedProcess] = []

    async def kill_and_go() -> None:
        helper = await containers.start_piped(SLEEPER, stdin=asyncio.subprocess.DEVNULL)
        helpers.append(helper)
        helper.close()
        assert helper.returncode is None  # killed, but its exit not seen yet
        await containers.reap_killed()

    asyncio.run(kill_and_go())  # the loop closes right after, as a test's does
    [helper] = helpers
    assert helper.returncode == -9
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        helpers.clear()
        del helper
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_reaping_waits_only_for_what_was_killed_and_is_bounded() -> None:
    running = await containers.start_piped(SLEEPER, stdin=asyncio.subprocess.DEVNULL)
    try:
        async with asyncio.timeout(5):  # nothing was killed: no wait
            await containers.reap_killed()
        assert running.returncode is None
    finally:
        running.close()
        await containers.reap_killed()
    assert running.returncode == -9


async def test_a_closing_kubelet_reaps_what_it_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    reaped: list[bool] = []
    reap = containers.reap_killed

    async def recording(*args: Any, **kwargs: Any) -> None:
        await reap(*args, **kwargs)
        reaped.append(True)

    monkeypatch.setattr(containers, "reap_killed", recording)
    async with running_cluster():
        pass
    assert reaped == [True]
