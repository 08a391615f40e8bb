"""Every call of the synchronous SDK against a real gateway process: create to Ready (warm),
run, run_stream, wait_exit, info, refresh_ttl, delete, get/list/pools, context managers, the
error classes, and one client shared by many threads."""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path

import pytest

import warmshell
from tests.helpers.cli import CliGateway
from tests.integration.sdk.conftest import wait_pool_idle

NPROC = "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])"


def test_create_returns_ready_warm_and_run_returns_the_output(client: warmshell.Client) -> None:
    wait_pool_idle(client, "default")
    with client.create(labels={"suite": "sdk"}) as sb:
        info = sb.last_info
        assert info.phase is warmshell.Phase.READY
        assert (info.allocation, info.pool) == (warmshell.Allocation.WARM, "default")
        assert info.timeline.ready_ms is not None
        r = sb.run(["python3", "-c", "print(6*7)"])
        assert (r.exit_code, r.stdout, r.stderr) == (0, b"42\n", b"")
        assert r.duration_ms > 0
        piped = sb.run(["sh", "-c", 'cat; echo "$A" >&2; pwd'], env={"A": "1"}, workdir="/tmp", stdin=b"in\n")
        assert (piped.exit_code, piped.stdout, piped.stderr) == (0, b"in\n/tmp\n", b"1\n")
        slow = sb.run(["sleep", "30"], timeout=1)
        assert slow.exit_code == 124
    assert sb.delete() is False  # the context manager already deleted it
    with pytest.raises(warmshell.NotFound):
        client.get(sb.name)


def test_run_returns_when_the_command_exits_though_a_background_child_holds_its_stdout(
    client: warmshell.Client,
) -> None:
    with client.create() as sb:
        start = time.monotonic()
        r = sb.run(["sh", "-c", "sleep 100 & echo $!"], timeout=60)
        assert r.exit_code == 0
        assert time.monotonic() - start < 30, "run waited for the background sleep"
        child = r.stdout.decode().strip()
        assert sb.run(["kill", "-0", child]).exit_code == 0  # `&` left it running
        start = time.monotonic()
        with sb.pty(["sh", "-c", "setsid sleep 100 & echo bye"]) as shell:
            assert shell.wait() == 0
        assert time.monotonic() - start < 30, "a job left on the terminal held the exec"


def test_secrets_keep_the_create_warm_and_reach_the_workload_by_name_only(client: warmshell.Client) -> None:
    wait_pool_idle(client, "default")
    with client.create(secrets={"API_KEY": "s3cr3t-sdk"}) as sb:
        assert (sb.last_info.allocation, sb.last_info.pool) == (warmshell.Allocation.WARM, "default")
        assert sb.run(["sh", "-c", 'printf %s "$API_KEY"']).stdout == b"s3cr3t-sdk"
        info = sb.info()
        assert info.secret_names == ("API_KEY",)
        assert "s3cr3t-sdk" not in repr(info)


def test_run_stream_yields_output_as_it_comes_then_the_exit_code(client: warmshell.Client) -> None:
    with client.create() as sb:
        stamps: list[tuple[float, warmshell.OutputEvent]] = []
        for event in sb.run_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done; exit 5"]):
            stamps.append((time.monotonic(), event))
        chunks = [e.stdout for _, e in stamps if e.stdout]
        assert b"".join(chunks) == b"1\n2\n3\n"
        assert stamps[-1][1].exit_code == 5
        assert stamps[-1][0] - stamps[0][0] >= 0.3  # the first line arrived before the command ended
        # Leaving early stops the command: the sandbox is free for the next one at once.
        stream = sb.run_stream(["sh", "-c", "echo start; sleep 30"])
        assert next(iter(stream)).stdout == b"start\n"
        stream.close()
        assert sb.run(["true"]).exit_code == 0


def test_info_refresh_ttl_get_list_and_pools(client: warmshell.Client) -> None:
    with client.create(name="listed", labels={"team": "a"}, ttl_seconds=60) as sb:
        first = sb.info().lifetime
        assert first.ttl_seconds == 60
        assert first.expires_at is not None
        refreshed = sb.refresh_ttl(1200).lifetime
        assert refreshed.ttl_seconds == 1200
        assert refreshed.expires_at is not None
        assert (refreshed.expires_at - first.expires_at).total_seconds() >= 1100
        assert client.get("listed").id == sb.id
        assert [i.name for i in client.list(labels={"team": "a"})] == ["listed"]
        assert client.list(labels={"team": "b"}) == []
        pools = {p.name: p for p in client.pools()}
        assert {"default", "cpu", "env-foo"} <= pools.keys()
        assert pools["default"].hits >= 1


def test_a_create_sets_its_own_process_count(client: warmshell.Client) -> None:
    with client.create(pids=48) as sb:
        assert sb.last_info.pids == 48
        assert sb.info().pids == 48
        limits = sb.last_info.condition("ResourceLimits")
        assert limits is not None
        if os.geteuid() == 0:  # a uid per sandbox: RLIMIT_NPROC is the bound, visible inside
            assert "48 processes" in limits.message
            assert sb.run(["python3", "-c", NPROC]).stdout == b"48\n"
    with pytest.raises(warmshell.InvalidArgument) as refused:
        client.create(pids=5)
    assert refused.value.field == "spec.resources.pids"


def test_a_one_shot_workload_exits_and_auto_delete_removes_it(client: warmshell.Client) -> None:
    sb = client.create(command=["sh", "-c", "echo out; echo err >&2; exit 3"], auto_delete=True)
    result = sb.wait_exit(timeout=30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert sb.last_info.phase is warmshell.Phase.EXITED
    assert sb.last_info.exit_code == 3
    with pytest.raises(warmshell.NotFound):
        client.get(sb.name)


def test_errors_are_named_classes(client: warmshell.Client, gateway: CliGateway, tmp_path: Path) -> None:
    with pytest.raises(warmshell.InvalidArgument) as invalid:
        client.create(name="Not_A_Label")
    assert invalid.value.field == "name"
    with pytest.raises(warmshell.InvalidArgument) as too_long:
        client.create(ttl_seconds=7200)
    assert (too_long.value.field, too_long.value.rule) == (
        "ttl_seconds",
        "7200 s is beyond the gateway's maximum of 3600 s ([lifetimes] max_ttl_seconds)",
    )
    with client.create(name="taken") as sb:
        with pytest.raises(warmshell.AlreadyExists):
            client.create(name="taken")
        with pytest.raises(warmshell.InvalidArgument) as refresh:
            sb.refresh_ttl(0)
        assert refresh.value.field == "ttl_seconds"
    done = client.create(command=["true"])
    done.wait_exit(timeout=30)
    with pytest.raises(warmshell.FailedPrecondition):
        done.run(["true"])
    done.delete()
    with (
        warmshell.Client(state_dir=gateway.state_dir, token="wrong") as stranger,
        pytest.raises(warmshell.Unauthenticated),
    ):
        stranger.list()
    with warmshell.Client(state_dir=tmp_path) as lost, pytest.raises(warmshell.Unavailable) as down:
        lost.list()
    assert f"no gateway socket at {tmp_path}/gateway.sock" in str(down.value)


def test_one_client_is_shared_by_many_threads(client: warmshell.Client) -> None:
    with client.create() as sb:

        def work(n: int) -> list[bytes]:
            return [sb.run(["echo", f"{n}-{i}"]).stdout for i in range(5)]

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(work, range(8)))
        assert results == [[f"{n}-{i}\n".encode() for i in range(5)] for n in range(8)]
