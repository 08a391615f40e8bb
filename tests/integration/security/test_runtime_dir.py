"""A root gateway's runtime directory (`local.runtime_dir`; by default on /run or /dev/shm, which
every user of the host may write to): each sandbox's egress directory, uid lease and log live
there, the egress directory reachable by that sandbox's uid alone, and a directory planted there
by someone else (another user's, one writable by others, a symlink) is refused, never read, used
nor changed."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.gateway import RunningGateway, own_sandbox_dir, running_gateway, runtime_dir_of
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, sh
from warmshell.drivers.local.runtime import holding, runtimedir, uidlease

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
        kept_logs = sorted(p.name for p in log.parent.iterdir())
        assert kept_logs == [holding.RECORD, f"{b.status.instance_id}.log"]  # for the next start
    async with running_gateway(tmp_path / "other", **{"local.runtime_dir": str(runtime)}) as other:
        await sandbox(other, "c")
    # The other gateway's directory of logs, empty once it deleted its sandbox, went at its stop.
    assert [p.name for p in runtime.glob("gw-*")] == [log.parent.name]


async def _unreachable_from(gw: RunningGateway, name: str, runtime: Path, egress: Path) -> None:
    """Neither the runtime directory nor another sandbox's egress directory is there inside."""
    for path in (runtime, egress, egress / "proxy.sock", *runtime.glob("gw-*")):
        code, _, err = await sh(gw, name, f"ls -d {path}")
        assert (code, "No such file" in err) == (2, True), (path, err)


# -- runtime directories of deleted sandbox directories (`holding`) -------------------------


def _runtime_for(shared: Path, name: str) -> tuple[Path, Path]:
    """A sandbox directory under `shared` and the runtime directory named for it there."""
    sandbox_dir = shared / name
    sandbox_dir.mkdir()
    return sandbox_dir, runtimedir.named_for(sandbox_dir, shared)


def _sweep(shared: Path) -> list[Path]:
    return holding.sweep_abandoned(shared, runtimedir.RUNTIME_PREFIX, runtimedir.runtime_named)


def _fill(runtime: Path) -> None:
    """What a gateway leaves in a runtime directory: a lease, a kept sandbox's log, an egress directory."""
    (runtime / uidlease.LEASES).mkdir()
    (runtime / uidlease.LEASES / "2000001").write_text("gw-x 1 1\n")
    (runtime / "gw-x").mkdir(mode=0o700)
    (runtime / "gw-x" / "li-00000000deadbeef.log").write_text("")
    (runtime / "li-00000000deadbeef.egress").mkdir(mode=0o700)


def test_a_runtime_directory_is_swept_once_its_sandbox_dir_is_gone_and_no_gateway_holds_it(shared: Path) -> None:
    sandbox_dir, runtime = _runtime_for(shared, "sandboxes")
    held = holding.hold(runtime, sandbox_dir)
    _fill(runtime)
    assert (runtime / holding.RECORD).read_text() == f"{sandbox_dir}\n"
    assert _sweep(shared) == []  # its sandbox directory is there
    sandbox_dir.rmdir()
    assert _sweep(shared) == []  # gone, but a live gateway holds it
    assert (runtime / "gw-x" / "li-00000000deadbeef.log").exists()
    held.close()
    assert _sweep(shared) == [runtime]
    assert sorted(p.name for p in shared.iterdir()) == []  # nothing renamed aside is left either


def test_a_runtime_directory_two_gateways_share_is_swept_only_once_both_let_go(shared: Path) -> None:
    sandbox_dir, runtime = _runtime_for(shared, "sandboxes")
    first, second = holding.hold(runtime, sandbox_dir), holding.hold(runtime, sandbox_dir)
    sandbox_dir.rmdir()
    first.close()
    assert _sweep(shared) == []
    assert runtime.is_dir()
    second.close()
    assert _sweep(shared) == [runtime]


def test_a_gateway_whose_runtime_directory_is_swept_as_it_takes_it_makes_a_fresh_one(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep between a gateway's `ensure` and its lock renames the directory away: the lock is
    then on the old one, which the gateway notices, and it makes and holds a new one."""
    sandbox_dir, runtime = _runtime_for(shared, "sandboxes")
    holding.hold(runtime, sandbox_dir).close()  # a stopped gateway's, recorded
    sandbox_dir.rmdir()
    swept: list[Path] = []
    real_flock = fcntl.flock

    def sweep_first(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_SH and not swept:  # the gateway's first lock: a sweep before it
            swept.extend(_sweep(shared))
            sandbox_dir.mkdir()  # the new gateway's sandbox directory, made right after the sweep
        real_flock(fd, operation)

    monkeypatch.setattr(holding.fcntl, "flock", sweep_first)
    held = holding.hold(runtime, sandbox_dir)
    monkeypatch.undo()
    assert swept == [runtime]
    sandbox_dir.rmdir()
    assert _sweep(shared) == []  # the new one, held
    assert (runtime / holding.RECORD).read_text() == f"{sandbox_dir}\n"
    held.close()


_LOOK_ALIKES = ["another_users", "writable_by_others", "symlink", "a_file", "no_record", "record_of_another_name"]


@pytest.mark.parametrize("plant", _LOOK_ALIKES)
def test_a_look_alike_of_an_abandoned_runtime_directory_is_left_as_it_was(shared: Path, plant: str) -> None:
    """Named as a runtime directory, recording a sandbox directory that is gone, but not one a
    gateway of this uid made for it: never read past its record, never changed."""
    sandbox_dir, runtime = _runtime_for(shared, "sandboxes")
    target = shared / "target"  # a directory a symlink plant points at, itself abandoned-looking
    for directory in (runtime, target):
        holding.hold(directory, sandbox_dir).close()
        _fill(directory)
    sandbox_dir.rmdir()
    if plant == "another_users":
        os.chown(runtime, _STRANGER, _STRANGER)
    elif plant == "writable_by_others":
        os.chmod(runtime, 0o733)
    elif plant == "symlink":
        shutil.rmtree(runtime)
        runtime.symlink_to(target)
    elif plant == "a_file":
        shutil.rmtree(runtime)
        runtime.write_text(f"{sandbox_dir}\n")
    elif plant == "no_record":  # an older gateway's: nothing says which sandbox directory it is for
        (runtime / holding.RECORD).unlink()
    else:  # the record of another name's sandbox directory: copied, not made here
        (runtime / holding.RECORD).write_text(f"{shared / 'elsewhere'}\n")
    before = {p: (os.lstat(p).st_uid, os.lstat(p).st_mode) for p in [runtime, *target.rglob("*")]}
    if runtime.is_dir() and not runtime.is_symlink():
        before |= {p: (os.lstat(p).st_uid, os.lstat(p).st_mode) for p in runtime.rglob("*")}
    assert _sweep(shared) == []
    after = {p: (os.lstat(p).st_uid, os.lstat(p).st_mode) for p in before}
    assert after == before


@needs_bwrap
async def test_a_gateways_start_sweeps_the_runtime_directory_of_a_deleted_sandbox_dir_but_not_a_live_ones(
    tmp_path: Path,
) -> None:
    """On the host's own tmpfs, through the gateway's start: a stopped gateway's runtime
    directory (a kept sandbox's log in it) goes once its sandbox directory is deleted; a running
    gateway's stays though its sandbox directory is deleted under it."""
    with own_sandbox_dir("warmshell-gone-") as gone, own_sandbox_dir("warmshell-live-") as live:
        stopped, running = runtime_dir_of(gone), runtime_dir_of(live)
        async with running_gateway(tmp_path / "a", **{"local.sandbox_dir": str(gone)}) as a:
            await sandbox(a, "kept")
            await a.stop()  # its record kept for a next start that never comes, and its log
        assert list(stopped.glob("gw-*/li-*.log"))
        shutil.rmtree(gone)
        async with running_gateway(tmp_path / "b", **{"local.sandbox_dir": str(live)}) as b:
            await sandbox(b, "one")
            assert not stopped.exists()
            shutil.rmtree(live)
            async with running_gateway(tmp_path / "c", **{"local.sandbox_dir": str(gone)}):
                assert running.is_dir()  # b holds it
            await b.delete("one")


@needs_bwrap
async def test_a_gateways_start_sweeps_the_logs_of_a_deleted_state_dir_in_a_shared_runtime_directory(
    tmp_path: Path,
) -> None:
    """Gateways that share a sandbox directory share its runtime directory, each with a directory
    of logs there: a stopped gateway's, a kept sandbox's log in it, goes at another's start once
    its state directory is deleted; the running gateway's own stays."""
    with own_sandbox_dir("warmshell-logs-") as sandboxes:
        runtime, shared_dir = runtime_dir_of(sandboxes), {"local.sandbox_dir": str(sandboxes)}
        async with running_gateway(tmp_path / "a", **shared_dir) as a:
            await sandbox(a, "kept")
            await a.stop()  # its record kept for a next start that never comes, and its log
        (stopped,) = runtime.glob("gw-*")
        assert list(stopped.glob("li-*.log"))
        shutil.rmtree(tmp_path / "a")
        async with running_gateway(tmp_path / "b", **shared_dir) as b:
            await sandbox(b, "one")
            (logs,) = runtime.glob("gw-*")
            assert logs != stopped
            assert (logs / holding.RECORD).read_text() == f"{(tmp_path / 'b').resolve()}\n"
            await b.delete("one")
