"""cgroup v1: where the hierarchies are, what is written where, and the backend on fake
directories (the real hierarchies are exercised in tests/integration/security/test_cgroup_bounds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.drivers.local.runtime import cgroups, cgroups_v1

# /proc/self/mountinfo and /proc/self/cgroup of this project's hosts (shortened).
MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
28 25 0:25 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
29 25 0:26 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
30 25 0:27 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
31 25 0:28 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
32 25 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
SELF = "8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n"


def test_each_controller_is_found_where_this_process_is() -> None:
    found = cgroups_v1.hierarchies(MOUNTINFO, SELF)
    assert found == {
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "cpuacct": Path("/sys/fs/cgroup/cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory/process_api/abc"),
        "pids": Path("/sys/fs/cgroup/pids"),
        "freezer": Path("/sys/fs/cgroup/freezer"),
    }


def test_comounted_controllers_and_a_containers_subtree_mount() -> None:
    # systemd mounts cpu and cpuacct together; a container sees only its own subtree, mounted
    # at the hierarchy's place: its root is taken off the process's path.
    mountinfo = (
        "40 30 0:31 /docker/c1 /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        "41 30 0:32 /docker/c1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "42 30 0:33 / /sys/fs/cgroup/with\\040space rw - cgroup cgroup rw,pids\n"
    )
    own = "3:cpu,cpuacct:/docker/c1\n2:memory:/docker/c1/gw\n1:pids:/elsewhere\n"
    assert cgroups_v1.hierarchies(mountinfo, own) == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory/gw"),
        "pids": Path("/sys/fs/cgroup/with space/elsewhere"),
    }
    # A process outside the mounted subtree cannot reach its cgroup there.
    assert "memory" not in cgroups_v1.hierarchies(mountinfo, "2:memory:/other\n")


def test_what_to_write_where() -> None:
    every = frozenset(cgroups_v1.CONTROLLERS)
    limits = cgroups.Limits(cpu_millis=500, memory_bytes=2**29, pids=64)
    assert cgroups_v1.control_files(limits, every, swap_accounted=True) == {
        "cpu": {"cpu.cfs_quota_us": "50000\n"},  # the period: a new group's default
        "memory": {"memory.limit_in_bytes": f"{2**29}\n", "memory.memsw.limit_in_bytes": f"{2**29}\n"},
        "pids": {"pids.max": "64\n"},
    }
    assert cgroups_v1.control_files(limits, frozenset({"memory"}), swap_accounted=False) == {
        "memory": {"memory.limit_in_bytes": f"{2**29}\n"}
    }
    assert cgroups_v1.control_files(cgroups.Limits(), every, swap_accounted=True) == {}


@given(st.integers(min_value=1, max_value=4096 * 1000), st.integers(min_value=4 * 2**20, max_value=2**46))
def test_memory_before_memory_and_swap_and_the_same_cpu_quota_as_v2(cpu: int, memory: int) -> None:
    limits = cgroups.Limits(cpu_millis=cpu, memory_bytes=memory)
    files = cgroups_v1.control_files(limits, frozenset(cgroups_v1.CONTROLLERS), swap_accounted=True)
    # The kernel refuses a memory+swap limit below the memory limit: the memory limit goes first.
    assert list(files["memory"]) == ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
    v2 = cgroups.control_files(limits, frozenset(cgroups.CONTROLLERS))
    assert v2["cpu.max"] == f"{files['cpu']['cpu.cfs_quota_us'].strip()} {cgroups.CPU_PERIOD_US}\n"


def fake_v1(tmp_path: Path, *controllers: str) -> cgroups_v1.CgroupV1:
    mountinfo = "".join(
        f"{20 + i} 1 0:{40 + i} / {tmp_path}/{c} rw - cgroup cgroup rw,{c}\n" for i, c in enumerate(controllers)
    )
    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "self").write_text("".join(f"{i}:{c}:/\n" for i, c in enumerate(controllers)))
    for controller in controllers:
        (tmp_path / controller).mkdir()
    (tmp_path / "memory" / "memory.memsw.limit_in_bytes").parent.mkdir(exist_ok=True)
    found = cgroups_v1.detect(tmp_path / "mountinfo", tmp_path / "self", gateway="gw-1")
    assert isinstance(found, cgroups_v1.CgroupV1), found
    return found


def test_a_group_in_each_hierarchy_with_its_limits(tmp_path: Path) -> None:
    backend = fake_v1(tmp_path, "cpu", "memory", "pids", "freezer", "cpuacct")
    assert backend.controllers == {"cpu", "memory", "pids", "freezer"}
    assert backend.parents["memory"] == tmp_path / "memory" / "warmshell" / "gw-1"
    group = backend.create("li-1", cgroups.Limits(cpu_millis=250, memory_bytes=2**28, pids=100))
    assert group.directories == tuple(tmp_path / c / "warmshell" / "gw-1" / "li-1" for c in cgroups_v1.CONTROLLERS)
    # The launcher enters through `tasks` (writing 0: its own thread, no threadgroup lock).
    assert group.entry_files == tuple(directory / "tasks" for directory in group.directories)
    assert group.procs_files == tuple(directory / "cgroup.procs" for directory in group.directories)
    memory = tmp_path / "memory" / "warmshell" / "gw-1" / "li-1"
    assert (memory / "memory.limit_in_bytes").read_text() == f"{2**28}\n"
    assert not (memory / "memory.memsw.limit_in_bytes").exists()  # no swap accounting here
    assert (tmp_path / "cpu" / "warmshell" / "gw-1" / "li-1" / "cpu.cfs_quota_us").read_text() == "25000\n"
    assert (tmp_path / "pids" / "warmshell" / "gw-1" / "li-1" / "pids.max").read_text() == "100\n"
    for controller, file, value in (
        ("cpuacct", "cpuacct.usage", "1500000000"),
        ("memory", "memory.usage_in_bytes", "4096"),
        ("memory", "memory.max_usage_in_bytes", "8192"),
        ("pids", "pids.current", "2"),
    ):
        (tmp_path / controller / "warmshell" / "gw-1" / "li-1" / file).write_text(value + "\n")
    assert backend.usage(group) == cgroups.Usage(
        cpu_seconds=1.5, memory_bytes=4096, memory_peak_bytes=8192, processes=2
    )


def test_swap_is_bounded_where_the_host_accounts_it(tmp_path: Path) -> None:
    backend = fake_v1(tmp_path, "memory")
    assert not backend.swap_accounted
    (backend.parents["memory"] / "memory.memsw.limit_in_bytes").write_text("")
    again = cgroups_v1.detect(tmp_path / "mountinfo", tmp_path / "self", gateway="gw-1")
    assert isinstance(again, cgroups_v1.CgroupV1)
    assert again.swap_accounted
    again.create("li-1", cgroups.Limits(memory_bytes=2**28))
    memsw = backend.parents["memory"] / "li-1" / "memory.memsw.limit_in_bytes"
    assert memsw.read_text() == f"{2**28}\n"


def test_only_the_mounted_controllers_count(tmp_path: Path) -> None:
    backend = fake_v1(tmp_path, "pids")
    assert backend.controllers == {"pids"}
    group = backend.create("li-1", cgroups.Limits(cpu_millis=250, memory_bytes=2**28, pids=64))
    assert group.directories == (tmp_path / "pids" / "warmshell" / "gw-1" / "li-1",)
    assert backend.usage(group) == cgroups.Usage(None, None, None, None)
    with pytest.raises(OSError, match="no writable cgroup v1 freezer"):
        backend.freeze(group, frozen=True)


def test_no_bounding_hierarchy_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(f"20 1 0:40 / {tmp_path}/freezer rw - cgroup cgroup rw,freezer\n")
    (tmp_path / "self").write_text("1:freezer:/\n")
    (tmp_path / "freezer").mkdir()
    found = cgroups_v1.detect(tmp_path / "mountinfo", tmp_path / "self", gateway="gw-1")
    assert isinstance(found, cgroups.Unavailable)
    assert found.message == "no writable cgroup v1 cpu, memory or pids hierarchy is mounted"


def test_an_unwritable_hierarchy_is_said(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(f"20 1 0:40 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n")
    (tmp_path / "self").write_text("1:memory:/\n")
    (tmp_path / "memory").write_text("a file, where a directory should be")
    found = cgroups_v1.detect(tmp_path / "mountinfo", tmp_path / "self", gateway="gw-1")
    assert isinstance(found, cgroups.Unavailable)
    assert "(memory: Not a directory)" in found.message


def test_the_sweep_removes_only_this_gateways_groups(tmp_path: Path) -> None:
    mine = fake_v1(tmp_path, "pids", "memory")
    other = cgroups_v1.detect(tmp_path / "mountinfo", tmp_path / "self", gateway="gw-2")
    assert isinstance(other, cgroups_v1.CgroupV1)
    mine.create("li-1", cgroups.Limits())
    mine.create("li-2", cgroups.Limits())
    theirs = other.create("li-3", cgroups.Limits())
    assert mine.sweep() == ["li-1", "li-2"]
    assert list((tmp_path / "pids" / "warmshell" / "gw-1").iterdir()) == []
    assert all(directory.is_dir() for directory in theirs.directories)
