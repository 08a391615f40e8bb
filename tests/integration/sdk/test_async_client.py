"""The asyncio SDK against a real gateway: the same calls as the sync client, awaited, with
`run_stream` as `async for` (creates that fail or time out: test_sdk_flow on kubesim)."""

from __future__ import annotations

from pathlib import Path

import pytest

import warmshell


async def test_every_call_awaited(aclient: warmshell.AsyncClient) -> None:
    async with await aclient.create(name="async-box", env={"A": "1"}, labels={"k": "v"}, ttl_seconds=60) as sb:
        assert sb.last_info.phase is warmshell.Phase.READY
        r = await sb.run(["sh", "-c", 'echo "$A"; cat'], stdin="x")
        assert (r.exit_code, r.stdout) == (0, b"1\nx")
        events = [e async for e in sb.run_stream(["sh", "-c", "echo a; echo b >&2; exit 2"])]
        assert b"".join(e.stdout for e in events) == b"a\n"
        assert b"".join(e.stderr for e in events) == b"b\n"
        assert events[-1].exit_code == 2
        info = await sb.info()
        assert info.labels == {"k": "v"}
        assert (await sb.refresh_ttl(900)).lifetime.ttl_seconds == 900
        assert (await aclient.get("async-box")).id == sb.id
        assert [i.name for i in await aclient.list(labels={"k": "v"})] == ["async-box"]
        assert {p.name for p in await aclient.pools()} >= {"default"}
    assert await sb.delete() is False
    with pytest.raises(warmshell.NotFound):
        await aclient.get("async-box")


async def test_a_create_sets_its_own_process_count(aclient: warmshell.AsyncClient) -> None:
    async with await aclient.create(pids=40) as sb:
        assert sb.last_info.pids == 40
        assert (await aclient.get(sb.name)).last_info.pids == 40


async def test_one_shot_with_auto_delete(aclient: warmshell.AsyncClient) -> None:
    sb = await aclient.create(command=["sh", "-c", "echo 42 > /workspace/out; cat /workspace/out"], auto_delete=True)
    result = await sb.wait_exit(timeout=30)
    assert (result.exit_code, result.stdout) == (0, b"42\n")
    assert sb.last_info.phase is warmshell.Phase.EXITED
    assert await aclient.list() == []


async def test_errors_are_named_classes(aclient: warmshell.AsyncClient, tmp_path: Path) -> None:
    with pytest.raises(warmshell.InvalidArgument) as invalid:
        await aclient.create(cpu="lots")
    assert invalid.value.field == "spec.resources.cpu"
    async with warmshell.AsyncClient(state_dir=tmp_path) as lost:
        with pytest.raises(warmshell.Unavailable):
            await lost.pools()
