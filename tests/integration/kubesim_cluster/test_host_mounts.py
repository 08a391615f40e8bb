"""The fork server's view of the host's top-level mounts follows the mount table: read once, and
read again after a mount (in a throw-away mount namespace of a child interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")

_CHILD = """
import ctypes, json, os, sys
from kubesim.kubelet import mountns
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(mountns.CLONE_NEWNS) == 0
assert libc.mount(None, b"/", None, mountns.MS_REC | mountns.MS_PRIVATE, None) == 0
view = mountns.HostMounts()
first = view.points()
unchanged = view.points() is first
assert libc.mount(b"tmpfs", sys.argv[1].encode(), b"tmpfs", 0, None) == 0
after, fresh = view.points(), mountns._top_level_mounts()
print(json.dumps({"first": first, "unchanged": unchanged, "after": after, "fresh": fresh}))
"""


def _top_level_directory() -> Path:
    """A directory of the root filesystem that is no mount point: a mount on it is top-level."""
    for name in sorted(os.listdir("/")):
        path = Path("/") / name
        if path.is_dir() and not path.is_symlink() and not os.path.ismount(path) and name not in ("proc", "tmp"):
            return path
    pytest.skip("no plain directory at the root")


def test_the_host_mounts_are_read_again_only_when_the_table_changes() -> None:
    target = _top_level_directory()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(target)], capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout)
    assert seen["unchanged"], "the table was parsed again with no change"
    assert seen["after"] == seen["fresh"], "a new mount was not seen"
    assert str(target) in seen["after"]
    assert str(target) not in seen["first"]
