"""The sandboxes' staged /etc, through the real launcher and real bwrap'd sandboxes."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.integration.drivers_local.support import needs_bwrap
from warmshell.drivers.local import sandboxing
from warmshell.drivers.local.launching import Launcher

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
