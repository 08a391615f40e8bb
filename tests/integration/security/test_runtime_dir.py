"""A root gateway's runtime directory (`local.runtime_dir`; by default on /run or /dev/shm, which
every user of the host may write to): each sandbox's egress directory, uid lease and log live
there, the egress directory reachable by that sandbox's uid alone, and a directory planted there
by someone else (another user's, one writable by others, a symlink) is refused, never read, used
nor changed."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, sh
from warmshell.drivers.local.runtime import runtimedir, uidlease

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a runtime directory is a root gateway's")

_STRANGER = 54_321  # a uid no sandbox of these tests runs as


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write to, as /dev/shm (sticky, 1777), outside pytest's 0700
    tmp_path (sandbox uids must traverse it)."""
    base = Path(tempfile.mkdtemp(prefix="warmshell-runtime-"))
    os.chmod(base, 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base)  # as root, whoever owns what is in it; symlinks are not followed


def test_a_runtime_directory_is_made_the_gateways_own_0711(shared: Path) -> None:
    made = shared / "made"
    runtimedir.ensure(made)
    info = os.lstat(made)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711)
    os.chmod(made, 0o755)  # the gateway's own, but wider than it needs: narrowed
    runtimedir.ensure(made)
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o711


_PLANTS = ["another_users", "writable_by_others", "symlink_to_a_dir", "dangling_symlink", "a_file"]


@pytest.mark.parametrize("plant", _PLANTS)
def test_a_planted_runtime_directory_is_refused_and_left_as_it_was(shared: Path, plant: str) -> None:
    planted, target = shared / "planted", shared / "target"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    if plant == "another_users":
        planted.mkdir(mode=0o711)
        os.chown(planted, _STRANGER, _STRANGER)
    elif plant == "writable_by_others":
        planted.mkdir()
        os.chmod(planted, 0o733)
    elif plant == "symlink_to_a_dir":  # the gateway's chmod would have gone to the target
        planted.symlink_to(target)
    elif plant == "dangling_symlink":  # the gateway's mkdir would have made the target
        planted.symlink_to(shared / "nowhere")
    else:
        planted.write_text("")
    before = os.lstat(planted)
    with pytest.raises(PermissionError, match=r"local\.runtime_dir"):
        runtimedir.ensure(planted)
    after = os.lstat(planted)
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert not (shared / "nowhere").exists()


@needs_bwrap
async def test_a_gateway_refuses_to_start_on_a_planted_runtime_directory(tmp_path: Path, shared: Path) -> None:
    planted = shared / "planted"
    planted.mkdir(mode=0o711)
    (planted / "gw-fake").mkdir()  # what a sweep would have read: instances to kill and remove
    (planted / "gw-fake" / "li-00000000deadbeef.log").write_text("")
    os.chown(planted, _STRANGER, _STRANGER)
    with pytest.raises(PermissionError, match=r"local\.runtime_dir"):
        async with running_gateway(tmp_path / "state", **{"local.runtime_dir": str(planted)}):
            pass
    assert sorted(p.name for p in planted.rglob("*")) == ["gw-fake", "li-00000000deadbeef.log"]


@needs_bwrap
async def test_a_sandboxs_runtime_files_are_its_uids_alone_and_go_with_it(tmp_path: Path, shared: Path) -> None:
    runtime = shared / "runtime"
    async with running_gateway(tmp_path / "state", **{"local.runtime_dir": str(runtime)}) as gw:
        a, b = await sandbox(gw, "a"), await sandbox(gw, "b")
        egress = runtime / f"{a.status.instance_id}.egress"
        (log,) = runtime.glob(f"gw-*/{a.status.instance_id}.log")  # a tmpfs workspace: nothing on disk
        assert stat.S_IMODE(os.lstat(log.parent).st_mode) == 0o700
        leases = {int(p.name): p for p in (runtime / uidlease.LEASES).iterdir() if p.name.isdigit()}
        info = os.lstat(egress)
        assert info.st_uid in leases  # its uid, leased here
        assert (stat.S_ISDIR(info.st_mode), stat.S_IMODE(info.st_mode)) == (True, 0o700)
        assert stat.S_IMODE(os.lstat(runtime).st_mode) == 0o711  # traversable, not listable
        await _unreachable_from(gw, "b", runtime, egress)
        await gw.delete("a")
        async with asyncio.timeout(10):  # its files go once its processes have
            while egress.exists() or log.exists() or (runtime / uidlease.LEASES / str(info.st_uid)).exists():
                await asyncio.sleep(0.05)
        kept = runtime / f"{b.status.instance_id}.egress"
        assert os.path.isdir(kept)  # the other's stays
        await gw.stop()  # b's record is kept (the next start reports it lost), its egress directory not
        assert not kept.exists()
        assert [p.name for p in log.parent.iterdir()] == [f"{b.status.instance_id}.log"]  # for the next start
    async with running_gateway(tmp_path / "other", **{"local.runtime_dir": str(runtime)}) as other:
        await sandbox(other, "c")
    # The other gateway's directory of logs, empty once it deleted its sandbox, went at its stop.
    assert [p.name for p in runtime.glob("gw-*")] == [log.parent.name]


async def _unreachable_from(gw: RunningGateway, name: str, runtime: Path, egress: Path) -> None:
    """Neither the runtime directory nor another sandbox's egress directory is there inside."""
    for path in (runtime, egress, egress / "proxy.sock", *runtime.glob("gw-*")):
        code, _, err = await sh(gw, name, f"ls -d {path}")
        assert (code, "No such file" in err) == (2, True), (path, err)
