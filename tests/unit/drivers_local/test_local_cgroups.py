"""cgroup v2 detection, limits, usage and sweep against fake hierarchies (this host has cgroup v1)."""

from __future__ import annotations

from pathlib import Path

from warmshell.drivers.local.runtime import cgroups


def fake_hierarchy(tmp_path: Path, *, delegated: str = "cpu memory pids") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / "gw").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids io\n")
    (root / "gw" / "cgroup.controllers").write_text(delegated + "\n")
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("1:name=systemd:/\n0::/gw\n")
    return root, self_cgroup


def test_v1_host_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()  # what a v1 /sys/fs/cgroup looks like: per-controller mounts
    found = cgroups.detect(tmp_path, tmp_path / "nope", gateway="gw-1")
    assert isinstance(found, cgroups.Unavailable)
    assert "not mounted" in found.message


def test_no_delegated_controller_is_unavailable(tmp_path: Path) -> None:
    root, self_cgroup = fake_hierarchy(tmp_path, delegated="io")
    found = cgroups.detect(root, self_cgroup, gateway="gw-1")
    assert isinstance(found, cgroups.Unavailable)
    assert "none of the cpu, memory and pids controllers is delegated" in found.message


def test_only_the_delegated_controllers_are_used(tmp_path: Path) -> None:
    root, self_cgroup = fake_hierarchy(tmp_path, delegated="pids io")
    found = cgroups.detect(root, self_cgroup, gateway="gw-1")
    assert isinstance(found, cgroups.CgroupV2)
    assert found.controllers == {"pids", "freezer"}  # every v2 cgroup but the root can be frozen
    assert (root / "gw" / "cgroup.subtree_control").read_text() == "+pids\n"
    (path,) = found.create("li-1", cgroups.Limits(cpu_millis=250, memory_bytes=2**28, pids=64)).directories
    assert sorted(p.name for p in path.iterdir()) == ["pids.max"]


def test_no_v2_line_is_unavailable(tmp_path: Path) -> None:
    root, self_cgroup = fake_hierarchy(tmp_path)
    self_cgroup.write_text("1:cpu:/\n")
    assert isinstance(cgroups.detect(root, self_cgroup, gateway="gw-1"), cgroups.Unavailable)


def test_delegated_hierarchy_enables_controllers_and_writes_limits(tmp_path: Path) -> None:
    root, self_cgroup = fake_hierarchy(tmp_path)
    found = cgroups.detect(root, self_cgroup, gateway="gw-1")
    assert isinstance(found, cgroups.CgroupV2)
    assert found.base == root / "gw" / "warmshell" / "gw-1"  # one parent per gateway
    for parent in (root / "gw", root / "gw" / "warmshell", found.base):
        assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids\n"

    group = found.create("li-1", cgroups.Limits(cpu_millis=250, memory_bytes=2**28, pids=100))
    (path,) = group.directories
    assert group.procs_files == (path / "cgroup.procs",)
    assert group.entry_files == group.procs_files  # v2: no moving one thread of a process
    assert (path / "cpu.max").read_text() == "25000 100000\n"
    assert (path / "memory.max").read_text() == f"{2**28}\n"
    assert (path / "pids.max").read_text() == "100\n"
    (only_memory,) = found.create("li-2", cgroups.Limits(memory_bytes=1024)).directories
    assert not (only_memory / "cpu.max").exists()
    assert not (only_memory / "pids.max").exists()


def test_what_to_write_where() -> None:
    every = frozenset(cgroups.CONTROLLERS)
    limits = cgroups.Limits(cpu_millis=1500, memory_bytes=2**30, pids=1024)
    assert cgroups.control_files(limits, every) == {
        "cpu.max": "150000 100000\n",
        "memory.max": f"{2**30}\n",
        "pids.max": "1024\n",
    }
    # The kernel refuses a quota under 1ms per period: 1m of cpu is written as that floor.
    assert cgroups.control_files(cgroups.Limits(cpu_millis=1), every) == {"cpu.max": "1000 100000\n"}
    assert cgroups.control_files(limits, frozenset({"memory"})) == {"memory.max": f"{2**30}\n"}
    assert cgroups.control_files(cgroups.Limits(), every) == {}


def test_usage_and_sweep_on_v2(tmp_path: Path) -> None:
    root, self_cgroup = fake_hierarchy(tmp_path)
    found = cgroups.detect(root, self_cgroup, gateway="gw-1")
    assert isinstance(found, cgroups.CgroupV2)
    group = found.create("li-1", cgroups.Limits(memory_bytes=2**28))
    (path,) = group.directories
    (path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (path / "memory.current").write_text("1048576\n")
    (path / "pids.current").write_text("3\n")
    # No memory.peak before Linux 5.19: that figure is unknown, not zero.
    assert found.usage(group) == cgroups.Usage(cpu_seconds=2.5, memory_bytes=2**20, memory_peak_bytes=None, processes=3)
    for file in path.iterdir():  # plain files, where cgroupfs would have none to remove
        file.unlink()
    assert found.sweep() == ["li-1"]
    assert not path.exists()
