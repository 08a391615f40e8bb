"""`sandboxio.terminals.open_in_root` as an unprivileged opener meets a devpts whose own `ptmx`
refuses it (mode 000, a host's devpts as a container without a runtime's devpts sees it): the
root's `/dev/ptmx` node gives a terminal of the devpts under that root, never of the opener's,
and a `/dev/ptmx` planted as a link is not followed. Each case runs in a mount namespace of its
own (a fresh devpts instance mounted in a temporary root), so it needs root to set up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a devpts instance: needs root and unshare"
)

# argv: the root, then how its dev/ptmx is made ("node" or "link"). Prints the devpts's device
# and the slave's, or the error, as the unprivileged opener (nobody) sees them.
OPENER = """
import ctypes, os, sys
from warmshell.sandboxio import terminals
root, ptmx = sys.argv[1:3]
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs(f"{root}/dev/pts")
if libc.mount(b"devpts", f"{root}/dev/pts".encode(), b"devpts", 0, b"newinstance,ptmxmode=000,mode=0620"):
    sys.exit(f"mount: {os.strerror(ctypes.get_errno())}")
if ptmx == "node":
    os.mknod(f"{root}/dev/ptmx", 0o020666, os.makedev(5, 2))
    os.chmod(f"{root}/dev/ptmx", 0o666)
else:
    os.symlink("/dev/ptmx", f"{root}/dev/ptmx")
pts = os.stat(f"{root}/dev/pts").st_dev
root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
os.setgid(65534)
os.setuid(65534)
try:
    master, slave = terminals.open_in_root(root_fd, owner_of_root=False)
except OSError as exc:
    print("refused", exc.errno)
else:
    print(pts, os.fstat(slave).st_dev, os.fstat(slave).st_uid)
"""


def open_as_nobody(root: Path, ptmx: str) -> list[str]:
    root.chmod(0o755)  # searched by the opener (its parents are not: it starts from a held fd)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", OPENER, str(root), ptmx],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_ptmx_of_mode_000_falls_back_to_the_roots_dev_ptmx(tmp_path: Path) -> None:
    pts, slave_device, owner = open_as_nobody(tmp_path, "node")
    assert slave_device == pts  # a terminal of the devpts under the root, not the opener's
    assert pts != str(os.stat("/dev/pts").st_dev)
    assert owner == "65534"


def test_a_dev_ptmx_link_is_not_followed(tmp_path: Path) -> None:
    assert open_as_nobody(tmp_path, "link") == ["refused", "40"]  # ELOOP
