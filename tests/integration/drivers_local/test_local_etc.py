"""The sandboxes' staged /etc, through the real launcher and real bwrap'd sandboxes."""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.drivers_local.support import DriverFactory, needs_bwrap, workspace_of
from tests.integration.drivers_local.test_local_cold import request
from tests.integration.drivers_local.waiting import read_when_present
from warmshell.core import egress
from warmshell.core.config import StatePaths
from warmshell.drivers.local.runtime import etcstage, launching, sandboxing
from warmshell.drivers.local.runtime.launching import Launcher

pytestmark = needs_bwrap


def test_sandboxes_prepared_at_once_share_one_staged_etc(tmp_path: Path) -> None:
    # Members of two pools are prepared in threads at the same moment (a race once made two
    # stages of one directory, and one start failed with "File exists").
    allowed = sorted({p.name for p in Path("/etc").iterdir()} & set(sandboxing.ETC_ALLOWED))
    for attempt in range(10):
        launcher = Launcher(bwrap=shutil.which("bwrap"), etc_dir=tmp_path / f"etc-{attempt}")
        together = threading.Barrier(8)

        def prepare(launcher: Launcher = launcher, together: threading.Barrier = together) -> None:
            together.wait()
            launcher.prepare("")

        with ThreadPoolExecutor(8) as threads:
            for done in [threads.submit(prepare) for _ in range(8)]:
                done.result()
        staged = tmp_path / f"etc-{attempt}"
        assert sorted(p.name for p in staged.iterdir()) == allowed
        assert (staged / "passwd").read_bytes() == Path("/etc/passwd").read_bytes()
        launcher.close()
        assert not staged.exists()  # a gateway that stops leaves no copy behind


def test_the_staged_etc_is_checked_at_most_once_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fill starts a hundred members a second: each start used to stat every staged file.
    launcher = Launcher(bwrap=shutil.which("bwrap"), etc_dir=tmp_path / "etc")
    refreshes: list[float] = []
    stage = launcher._etc
    assert stage is not None
    real = stage.refresh
    now = [1000.0]
    monkeypatch.setattr(launching.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(stage, "refresh", lambda: (refreshes.append(now[0]), real())[1])
    for _ in range(5):
        launcher.prepare("")
    assert refreshes == [1000.0]
    now[0] += launching.ETC_REFRESH_SECONDS
    launcher.prepare("")
    launcher.prepare("")
    assert refreshes == [1000.0, 1000.0 + launching.ETC_REFRESH_SECONDS]
    assert (tmp_path / "etc" / "passwd").read_bytes() == Path("/etc/passwd").read_bytes()
    launcher.close()


async def test_a_sandbox_gets_the_allowed_etc_directories_in_one_mount(
    make_driver: DriverFactory, paths: StatePaths
) -> None:
    # The allowed directories are copied into the stage rather than bound one each (but those too
    # big to copy): the mounts under /etc inside are few, and the trees read as on the host.
    probe = (
        "awk '{print $5}' /proc/self/mountinfo | grep '^/etc' > /workspace/etc-mounts; "
        "ls -A /etc/ssl/certs > /workspace/certs; "
        "ls -A /etc/ssl > /workspace/ssl; "
        "mv /workspace/certs /workspace/done; exec sleep 600"
    )
    async with make_driver(script=probe) as driver:
        created = await driver.create(request())
        workspace = workspace_of(paths, created.instance_id)
        certs = await read_when_present(workspace / "done")
        # The copy, and a bind of each allowed directory too big to copy only: never /etc/ssl,
        # copied whatever its size, its system CA bundle a link (no bind over it either).
        big = [
            f"/etc/{n}"
            for n in sorted(sandboxing.ETC_ALLOWED)
            if n != "ssl" and etcstage.too_big_to_copy(Path("/etc", n))
        ]
        assert (workspace / "etc-mounts").read_text().split() == ["/etc", *big]
        assert len(big) < len([n for n in sandboxing.ETC_ALLOWED if Path("/etc", n).is_dir()])
        # The host's names, and the host's bundle kept beside the link when it is a regular file.
        system = Path(egress.SYSTEM_BUNDLE)
        kept = [Path(egress.HOST_BUNDLE).name] if system.is_file() and not system.is_symlink() else []
        assert certs.split() == sorted([*os.listdir("/etc/ssl/certs"), *kept])  # `ls` runs in the C locale
        # Every name the host has (ssl/private too: bound, or an empty placeholder; see test_files).
        assert (workspace / "ssl").read_text().split() == sorted(os.listdir("/etc/ssl"))


def _public(path: Path) -> bool:
    mode = path.lstat().st_mode
    return path.is_symlink() or bool(mode & (0o001 if path.is_dir() else 0o004))
