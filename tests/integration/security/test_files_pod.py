"""The FileService against a workload on Kubernetes (kubesim): a pod's supervisor serves files in
the workload container's filesystem, under the root its agent sent, while its own container holds
the pod's projected token. The workload plants links at that token (absolute, climbing with
`..`, through `/proc/1/root`), asks for it through `..`, and swaps names under running calls, as
`test_files_api.py` and `test_files_races.py` do on the local driver: no call may return, change
or remove anything of the supervisor's container, and none may hang on a FIFO."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from kubesim.cluster import RunningCluster
from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_kubernetes.conftest import admin, cluster, gateway_settings  # noqa: F401
from tests.integration.drivers_kubernetes.test_attacks import pod_token
from tests.integration.security.support import Attempts, wait_for
from tests.integration.security.test_files_api import NAME, Files, code_of
from tests.integration.security.test_files_races import RACER
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.kubernetes.rendering import TOKEN_DIR, TOKEN_PATH

pytestmark = pytest.mark.timeout(180)

RACE_SECONDS = 5.0
# The local race's workload, its file link aimed at the token (`d-link` is the token's directory).
TOKEN_RACER = RACER.replace('host_dir + "/f"', 'host_dir + "/token"')
assert TOKEN_RACER != RACER


@pytest.fixture
async def gw(cluster: RunningCluster, tmp_path: Path) -> AsyncIterator[RunningGateway]:  # noqa: F811
    state = tmp_path / "state"
    async with running_gateway(state, **gateway_settings(cluster, state)) as running:
        await running.create(name=NAME)
        ready = await running.wait_ready(NAME, timeout=60)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY
        yield running


async def sh(gw: RunningGateway, script: str) -> None:
    code, _, err = await gw.exec(NAME, ["sh", "-c", script])
    assert code == 0, err


async def test_links_and_dot_dots_to_the_supervisors_token_stay_in_the_workload(
    gw: RunningGateway,
    cluster: RunningCluster,  # noqa: F811
) -> None:
    sandbox = await gw.wait_ready(NAME, timeout=5)
    token = pod_token(cluster, sandbox)
    assert token  # it exists, in the supervisor's container
    files = Files(gw)
    await sh(
        gw,
        f"ln -s {TOKEN_PATH} /workspace/abs; ln -s ../../../../..{TOKEN_PATH} /workspace/climb;"
        f" ln -s /proc/1/root{TOKEN_DIR} /workspace/magic; ln -s {TOKEN_DIR} /workspace/dir",
    )
    # The workload's own view of those paths: the token's directory is not mounted there.
    for path in (TOKEN_PATH, "/workspace/abs", "/workspace/climb", f"/workspace/../..{TOKEN_PATH}"):
        assert await code_of(files.read(path)) == grpc.StatusCode.NOT_FOUND, path
    assert await code_of(files.list("/workspace/dir")) == grpc.StatusCode.NOT_FOUND
    assert await code_of(files.stat(TOKEN_PATH)) == grpc.StatusCode.NOT_FOUND
    # Magic links are refused (ELOOP), /proc itself is never served, and the workload's /proc has
    # no "self" for the supervisor (a process of another PID namespace).
    refusals = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
    for path in ("/workspace/magic/token", f"/proc/1/root{TOKEN_PATH}", "/proc/self/root/etc/hostname"):
        assert await code_of(files.read(path)) in refusals, path
    # Writes and removals through the same links change nothing of the supervisor's.
    for path in ("/workspace/abs", "/workspace/climb", TOKEN_PATH, "/workspace/dir/token"):
        await code_of(files.write(path, b"pwned"))
        await code_of(files.remove(path))
    await code_of(files.remove("/workspace/dir", recursive=True))
    assert pod_token(cluster, sandbox) == token
    code, out, _ = await gw.exec(NAME, ["cat", f"/proc/1/root{TOKEN_PATH}"])
    assert (code, out) != (0, token.encode())  # nor did the workload gain it any other way


async def test_swaps_during_file_calls_never_reach_the_supervisors_token(
    gw: RunningGateway,
    cluster: RunningCluster,  # noqa: F811
) -> None:
    sandbox = await gw.wait_ready(NAME, timeout=5)
    token = pod_token(cluster, sandbox).encode()
    files = Files(gw)
    racer = asyncio.create_task(gw.exec(NAME, ["python3", "-c", TOKEN_RACER, TOKEN_DIR, str(RACE_SECONDS)]))
    await wait_for(lambda: files.stat("/workspace/d-link"))
    calls = Attempts(timeout=10.0)
    loop = asyncio.get_running_loop()
    end = loop.time() + RACE_SECONDS - 1
    while loop.time() < end and not racer.done():
        await asyncio.gather(
            calls.attempt("read", files.read("/workspace/d/f")),
            calls.attempt("write", files.write("/workspace/d/new", b"pwned")),
            calls.attempt("list", files.list("/workspace/d")),
            calls.attempt("stat", files.stat("/workspace/d/f")),
        )
    code, out, err = await racer
    assert code == 0, err
    assert int(out.split()[-1]) > 100, f"the race hardly ran: {out!r}"
    assert not calls.unclear, calls.unclear
    read_back = set(calls.results["read"])
    assert token not in b"".join(read_back)  # type: ignore[arg-type]
    assert read_back <= {b"inside", b""}, read_back
    assert calls.outcomes["read:OK"] > 0, calls.outcomes
    assert pod_token(cluster, sandbox).encode() == token
    assert await code_of(files.stat(f"{TOKEN_DIR}/new")) == grpc.StatusCode.NOT_FOUND
