"""Two root gateways on one host never hand out the same host uid (found: each drew at random
from the same range, so a fork bomb in one gateway's sandbox, counted against the shared uid's
RLIMIT_NPROC, made every exec in the other's fail), and a uid of a gateway killed with -9 is
taken back once its sandbox is gone."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.helpers.cli import start_gateway
from tests.helpers.gateway import RunningGateway, own_sandbox_dir, running_gateway, runtime_dir_of
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import process_tree, sandbox
from warmshell.core.ids import SandboxId
from warmshell.drivers.local import LocalDriver
from warmshell.drivers.local.runtime import uidlease

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox needs a root gateway")]


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    with own_sandbox_dir("warmshell-uids-") as directory:  # this test's own (shared by its gateways)
        yield directory


@pytest.fixture
def uid_base() -> int:
    return random.randrange(3_000_000, 3_900_000)  # a range of this test's own


def settings(sandbox_dir: Path, base: int) -> dict[str, object]:
    return {"local.sandbox_dir": str(sandbox_dir), "local.sandbox_uid_base": base, "local.sandbox_uid_count": 2}


def uid_of(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(status.split("\nUid:")[1].split()[0])


def bwrap_pid(gw: RunningGateway, sandbox_id: str) -> int:
    driver = gw.gateway.parts.driver
    assert isinstance(driver, LocalDriver)
    process = driver._sandboxes[SandboxId(sandbox_id)].process
    assert process is not None
    return process.pid


async def test_two_gateways_with_overlapping_ranges_never_share_a_uid(
    tmp_path: Path, sandbox_dir: Path, uid_base: int
) -> None:
    # Ranges of 2 overlapping in one uid: {base, base+1} and {base+1, base+2}.
    async with (
        running_gateway(tmp_path / "a", **settings(sandbox_dir, uid_base)) as a,
        running_gateway(tmp_path / "b", **settings(sandbox_dir, uid_base + 1)) as b,
    ):
        made = [(a, await sandbox(a, "a1")), (a, await sandbox(a, "a2")), (b, await sandbox(b, "b1"))]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await b.create(name="b2")  # its range: base+1 (a's) and base+2 (b1's)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "local.sandbox_uid_count" in str(refused.value.details())
        owners: dict[int, str] = {}
        for gw, made_sandbox in made:
            uids = {uid_of(pid) for pid in process_tree(bwrap_pid(gw, made_sandbox.id))} - {None}
            assert len(uids) == 1, (made_sandbox.name, uids)
            (uid,) = uids
            assert uid_base <= uid <= uid_base + 2
            assert uid not in owners, f"{made_sandbox.name} and {owners.get(uid)} share uid {uid}"
            owners[uid] = made_sandbox.name
        # Nothing else on the host runs as these uids either.
        trees = set().union(*(process_tree(bwrap_pid(gw, s.id)) for gw, s in made))
        others = [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if uid_of(p) in owners]
        assert set(others) <= trees
        # A uid given back is leased again, to whichever gateway asks.
        assert owners[uid_base + 2] == "b1"
        await a.delete(owners[uid_base + 1])
        await sandbox(b, "b2")


async def test_a_killed_gateways_uid_is_taken_back_once_its_sandbox_is_gone(
    tmp_path: Path, sandbox_dir: Path, uid_base: int
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f'[local]\nsandbox_dir = "{sandbox_dir}"\nsandbox_uid_base = {uid_base}\nsandbox_uid_count = 1\n')
    killed = start_gateway(tmp_path / "killed", "--config", str(config))
    assert killed.run("sandbox", "create", "--name", "doomed").returncode == 0
    killed.process.send_signal(signal.SIGKILL)
    killed.process.wait()
    holder = uidlease.Holder.parse((runtime_dir_of(sandbox_dir) / uidlease.LEASES / str(uid_base)).read_text())
    assert holder is not None
    assert holder.pid == killed.process.pid  # its lease outlives it
    overrides = {**settings(sandbox_dir, uid_base), "local.sandbox_uid_count": 1}
    async with running_gateway(tmp_path / "next", **overrides) as gw:
        refusals: list[grpc.StatusCode] = []
        for _ in range(100):  # the killed gateway's sandbox goes with it, in a moment
            try:
                await sandbox(gw, "heir")
                break
            except grpc.aio.AioRpcError as exc:
                refusals.append(exc.code())
                await asyncio.sleep(0.05)
        assert set(refusals) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
        ready = await gw.get("heir")
        assert {uid_of(pid) for pid in process_tree(bwrap_pid(gw, ready.id))} - {None} == {uid_base}
    # The killed gateway's next start sweeps what else it left (its sandbox's cgroups).
    async with running_gateway(tmp_path / "killed", **overrides):
        pass
