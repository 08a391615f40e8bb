"""What a root gateway's sandbox launch leaves of the host's mounts. bwrap, which builds the
boundary, starts in a mount namespace of the launch's own holding only the mounts it binds or
reads (`warmshell-launch --keep-tree/--keep`: the rest detached there, as bwrap parses the whole
table once per bind mount); those detaches never reach the host's namespace, and from inside a
sandbox nothing of the host's other mounts is reachable, whatever path is tried."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.helpers.gateway import running_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.security.support import sandbox, sh, still_real

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="a launch trims its mounts only as root (a user's are locked)"),
]


def mount_points(pid: int | str = "self") -> list[str]:
    return [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]


def outer_bwraps() -> list[int]:
    """This process's bwrap children: each sandbox's outer bwrap process, in its launch's namespace."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            name, rest = (entry / "stat").read_text().split("(", 1)[1].split(")", 1)
            if name == "bwrap" and int(rest.split()[1]) == os.getpid():
                found.append(int(entry.name))
    return found


async def test_bwraps_namespace_holds_only_what_it_needs_and_the_host_keeps_every_mount(tmp_path: Path) -> None:
    host = sorted(mount_points())
    assert "/sys" in host  # the host has mounts no sandbox needs
    async with running_gateway(tmp_path / "state") as gw:
        await sandbox(gw, "trimmed")
        (outer,) = outer_bwraps()
        launched = mount_points(outer)
        # Only the mounts holding a bound or read path (/, /proc, /dev, the tmpfs of the sandbox's
        # runtime directory): no /sys, no devpts of the host's.
        assert [p for p in launched if p == "/sys" or p.startswith(("/sys/", "/dev/pts"))] == []
        assert {"/", "/proc", "/dev"} <= set(launched)
        assert len(launched) < len(host)
        # From inside: the host's /sys mounts, its devpts and the launch's old root are nowhere.
        code, out, _ = await sh(
            gw,
            "trimmed",
            "cat /proc/self/mountinfo /proc/1/mountinfo; ls -A /sys/fs/cgroup /oldroot /newroot 2>&1; echo end",
        )
        assert code == 0
        inside = [line.split()[4] for line in out.splitlines() if len(line.split()) > 4 and line[0].isdigit()]
        assert not [p for p in inside if p.startswith(("/sys", "/oldroot", "/newroot", "/mnt"))]
        assert "cgroup.procs" not in out
        assert out.endswith("end\n")
        await still_real(gw, "trimmed")
        assert sorted(mount_points()) == host  # not one of the host's mounts went with the detaches
    assert sorted(mount_points()) == host
