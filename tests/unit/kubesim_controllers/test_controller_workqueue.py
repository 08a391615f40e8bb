import asyncio

from kubesim.controllers.workqueue import WorkQueue


async def test_a_key_is_never_reconciled_concurrently_and_reruns_when_dirty() -> None:
    running: set[str] = set()
    overlaps = 0
    calls: list[str] = []
    gate = asyncio.Event()
    started = asyncio.Event()
    done = asyncio.Event()

    async def reconcile(key: str) -> float | None:
        nonlocal overlaps
        if key in running:
            overlaps += 1
        running.add(key)
        calls.append(key)
        started.set()
        if len(calls) == 1:
            await gate.wait()
        running.discard(key)
        if len(calls) == 2:
            done.set()
        return None

    queue: WorkQueue[str] = WorkQueue("t", reconcile, workers=4)
    task = asyncio.create_task(queue.run())
    queue.add("k")
    await asyncio.wait_for(started.wait(), 5)
    queue.add("k")  # while the first run is in progress: must wait, then run once more
    queue.add("k")
    gate.set()
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls == ["k", "k"]
    assert overlaps == 0


async def test_requeue_after_and_failure_retry() -> None:
    attempts = 0
    done = asyncio.Event()

    async def reconcile(key: str) -> float | None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("temporary")
        if attempts == 2:
            return 0.01
        done.set()
        return None

    queue: WorkQueue[str] = WorkQueue("t", reconcile, workers=1)
    task = asyncio.create_task(queue.run())
    queue.add("k")
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert attempts == 3
