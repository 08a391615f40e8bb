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


def test_through_a_v1_tasks_file_it_moves_its_own_thread_by_writing_0(tmp_path: Path) -> None:
    # 0 is the calling thread: a move the kernel makes without its threadgroup lock (a pid makes
    # it wait for an RCU grace period when no migration ran for a few ms).
    tasks = tmp_path / "tasks"
    done = launch(f"--cgroup={tasks}", f"--cgroup={tmp_path / 'cgroup.procs'}", "--", "/bin/sh", "-c", "echo $$")
    assert done.returncode == 0, done.stderr
    assert tasks.read_text() == "0\n"
    assert (tmp_path / "cgroup.procs").read_text() == done.stdout


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
        (["--keep=proc"], "a kept path must be absolute: --keep=proc"),
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


def mount_points(mountinfo: str) -> list[str]:
    return [line.split()[4] for line in mountinfo.splitlines()]


# bwrap parses the whole mount table once per bind mount it makes: fewer mounts, a cheaper start.
BWRAP_READS = ("--keep-tree=/proc", "--keep=/tmp", "--keep=/dev/null")


@pytest.mark.skipif(os.geteuid() != 0, reason="an image root's idmapped layers need root")
def test_an_image_roots_namespace_keeps_only_what_bwrap_binds_or_reads(tmp_path: Path) -> None:
    (tmp_path / "rootfs").mkdir()
    (tmp_path / "layer").mkdir()
    image = [f"--rootfs={tmp_path / 'rootfs'}", "--root-size=1048576", f"--layer={tmp_path / 'layer'}"]
    keep = [f"--keep-tree={tmp_path / 'rootfs' / 'm'}", *BWRAP_READS]
    done = launch("--uid=2100321", *image, *keep, "--", "/bin/cat", "/proc/self/mountinfo")
    assert done.returncode == 0, done.stderr
    # The layers' own mounts go too: the overlay holds clones of them.
    assert sorted(mount_points(done.stdout)) == sorted(
        ["/", "/proc", "/dev", f"{tmp_path}/rootfs", f"{tmp_path}/rootfs/m"]
    )
    assert "/sys" in mount_points(Path("/proc/self/mountinfo").read_text())  # the host keeps its own


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of the launch's own needs root")
def test_a_host_roots_launch_trims_a_namespace_of_its_own_and_keeps_a_bound_trees_submounts() -> None:
    host = mount_points(Path("/proc/self/mountinfo").read_text())
    done = launch("--uid=2100321", "--keep-tree=/dev", *BWRAP_READS, "--", "/bin/cat", "/proc/self/mountinfo")
    assert done.returncode == 0, done.stderr
    inside = mount_points(done.stdout)
    assert sorted(inside) == sorted(p for p in host if p in ("/", "/proc") or p == "/dev" or p.startswith("/dev/"))
    assert "/sys" not in inside
    assert "/sys" in mount_points(Path("/proc/self/mountinfo").read_text())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_kept_tree_behind_a_symlink_and_a_mount_point_with_a_space_are_kept(tmp_path: Path) -> None:
    # mountinfo escapes a space as \040; a bind source may be a symlink to where the mount is.
    spaced = tmp_path / "a dir"
    (spaced / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(spaced)
    script = (
        'mount -t tmpfs kept "$1/a dir/sub" && mount -t tmpfs gone "$1/other" && '
        'exec "$2" --uid=2100321 --keep-tree="$1/link" --keep=/proc --keep=/tmp -- /bin/cat /proc/self/mountinfo'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", str(tmp_path), LAUNCH],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    inside = mount_points(done.stdout)
    assert str(spaced / "sub").replace(" ", "\\040") in inside
    assert str(tmp_path / "other") not in inside
    assert "/dev" not in inside  # nothing kept it
