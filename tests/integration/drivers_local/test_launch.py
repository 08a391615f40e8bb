"""`warmshell-launch`, the prefix of every local sandbox's command line, run as the driver runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from warmshell.drivers.local.runtime import launching

LAUNCH = str(launching.LAUNCH_BINARY)


def launch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LAUNCH, *argv], capture_output=True, text=True, timeout=10, check=False)


def test_it_enters_the_cgroup_as_itself_before_the_program_runs(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"  # a plain file where cgroupfs has its control file
    done = launch(f"--cgroup={procs}", "--", "/bin/sh", "-c", "echo $$")
    assert done.returncode == 0, done.stderr
    assert procs.read_text() == done.stdout  # the pid that then exec'd the program: the same process


def test_it_enters_a_cgroup_in_each_v1_hierarchy(tmp_path: Path) -> None:
    files = [tmp_path / controller / "cgroup.procs" for controller in ("cpu", "memory", "pids")]
    for procs in files:
        procs.parent.mkdir()
    done = launch(*(f"--cgroup={procs}" for procs in files), "--", "/bin/sh", "-c", "echo $$")
    assert done.returncode == 0, done.stderr
    assert [procs.read_text() for procs in files] == [done.stdout] * 3


def test_priority_and_rlimits_reach_the_program() -> None:
    done = launch(
        "--priority=7", "--fsize=4096:8192", "--", "/bin/sh", "-c", "nice; grep 'Max file size' /proc/self/limits"
    )
    assert done.returncode == 0, done.stderr
    niceness, limits = done.stdout.splitlines()
    assert int(niceness) == os.getpriority(os.PRIO_PROCESS, 0) + 7
    assert limits.split()[3:6] == ["4096", "8192", "bytes"]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_it_drops_to_the_sandbox_uid_with_no_groups() -> None:
    done = launch("--uid=2100321", "--", "/bin/sh", "-c", "id -u; id -g; id -G")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2100321", "2100321", "2100321"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus=1"], "unknown option: --bogus=1"),
        (["--fsize=lots"], "not a number: --fsize=lots"),
        (["--cgroup=/nonexistent/dir/cgroup.procs"], "cannot open the cgroup"),
    ],
)
def test_a_bad_option_stops_it_before_the_program(tmp_path: Path, argv: list[str], said: str) -> None:
    marker = tmp_path / "ran"
    done = launch(*argv, "--", "/usr/bin/touch", str(marker))
    assert done.returncode == 125
    assert said in done.stderr
    assert not marker.exists()


def test_the_program_must_be_an_absolute_path(tmp_path: Path) -> None:
    done = launch("--priority=1", "--", "touch", str(tmp_path / "ran"))
    assert done.returncode == 125
    assert "PROGRAM must be an absolute path" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="an image root's idmapped layers need root")
def test_an_image_roots_namespace_leaves_the_hosts_sys_out_and_the_host_keeps_it(tmp_path: Path) -> None:
    # bwrap parses the whole mount table once per bind mount: fewer mounts, a cheaper start.
    (tmp_path / "rootfs").mkdir()
    (tmp_path / "layer").mkdir()
    image = [f"--rootfs={tmp_path / 'rootfs'}", "--root-size=1048576", f"--layer={tmp_path / 'layer'}"]
    done = launch("--uid=2100321", *image, "--", "/bin/cat", "/proc/self/mountinfo")
    assert done.returncode == 0, done.stderr
    points = [line.split()[4] for line in done.stdout.splitlines()]
    assert f"{tmp_path}/rootfs/m" in points  # the image's overlay
    assert [p for p in points if p == "/sys" or p.startswith("/sys/")] == []
    assert "/sys" in [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
