"""The local sandbox's bounds: defaults and overrides, the prlimit prefix, the condition (exactly
what is and is not enforced), the configured maximum."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.config import LocalDriverConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import Resources, SandboxSpec, Storage
from warmshell.drivers.local.runtime import cgroups, limits


def most(config: LocalDriverConfig, host_cpus: int = 64, host_memory: int = 2**40) -> limits.Maximums:
    return limits.Maximums.of(config, host_cpus=host_cpus, host_memory=host_memory)


V1 = cgroups.Unavailable("cgroup v1 host")


def spec(pids: int = 0, storage: Storage | None = None, **resources: str) -> SandboxSpec:
    return SandboxSpec(resources=Resources(pids=pids, **resources), storage=storage or Storage())


def delegated(*controllers: str) -> cgroups.CgroupV2:
    return cgroups.CgroupV2(Path("/sys/fs/cgroup/gw/warmshell"), frozenset(controllers))


def test_defaults_come_from_the_config() -> None:
    bounds = limits.Bounds.of(LocalDriverConfig())
    assert bounds == limits.Bounds(
        workspace_bytes=2**30,
        tmp_bytes=256 * 2**20,
        run_bytes=16 * 2**20,
        shm_bytes=64 * 2**20,
        file_bytes=4 * 2**30,
        processes=1024,
        cpu_millis=1000,
        memory_bytes=2 * 2**30,
    )
    unbounded = limits.Bounds.of(LocalDriverConfig(workspace_size="", default_cpu="", default_memory=""))
    assert (unbounded.workspace_bytes, unbounded.cpu_millis, unbounded.memory_bytes) == (None, None, None)


def test_a_spec_overrides_the_defaults_it_names() -> None:
    defaults = limits.Bounds.of(LocalDriverConfig())
    assert defaults.for_spec(spec()) is defaults
    mine = defaults.for_spec(spec(pids=64, cpu="250m", storage=Storage(workspace="8Gi", tmp="1Mi")))
    assert (mine.processes, mine.cpu_millis, mine.memory_bytes) == (64, 250, 2 * 2**30)
    assert (mine.workspace_bytes, mine.tmp_bytes, mine.run_bytes) == (8 * 2**30, 2**20, 16 * 2**20)
    assert mine.cgroup_limits() == cgroups.Limits(cpu_millis=250, memory_bytes=2 * 2**30, pids=64)


def test_the_process_rlimit_needs_a_uid_per_sandbox() -> None:
    bounds = limits.Bounds.of(LocalDriverConfig(max_processes=99))
    assert limits.prlimit_argv(bounds, uid_per_sandbox=False) == [
        limits.PRLIMIT,
        f"--fsize={4 * 2**30}",
        "--nofile=1024",
        "--",
    ]
    assert limits.prlimit_argv(bounds, uid_per_sandbox=True) == [
        limits.PRLIMIT,
        f"--fsize={4 * 2**30}",
        "--nofile=1024",
        "--nproc=99",
        "--",
    ]


def test_open_files_per_process_keep_the_sandbox_within_its_share_of_the_file_table() -> None:
    # A host with fs.file-max 400,000: one sandbox's processes may hold 100,000 open files.
    bounds = limits.Bounds.of(LocalDriverConfig(), host_file_max=400_000)
    assert bounds.file_budget == 100_000
    assert bounds.open_files == 97  # 1024 processes x 97 <= 100,000
    assert bounds.for_spec(spec(pids=16)).open_files == 1024  # few processes: the configured limit
    assert bounds.for_spec(spec(pids=32768)).open_files == limits.MIN_OPEN_FILES  # the floor
    assert limits.Bounds.of(LocalDriverConfig(max_open_files=4096)).open_files == 4096  # no file-max known


@given(
    st.integers(min_value=16, max_value=2**22),
    st.integers(min_value=64, max_value=2**20),
    st.integers(min_value=1, max_value=2**63 - 1),
)
def test_a_sandbox_never_passes_its_share_unless_at_the_floor(processes: int, per_process: int, file_max: int) -> None:
    config = LocalDriverConfig(max_open_files=per_process, max_pids=2**22)
    bounds = dataclasses.replace(limits.Bounds.of(config, host_file_max=file_max), processes=processes)
    assert limits.MIN_OPEN_FILES <= bounds.open_files <= per_process
    assert (
        bounds.open_files == limits.MIN_OPEN_FILES
        or bounds.open_files * processes <= file_max // limits.FILE_TABLE_SHARE
    )


def test_the_condition_says_when_the_floor_passes_the_share() -> None:
    bounds = limits.Bounds.of(LocalDriverConfig(), host_file_max=400_000).for_spec(spec(pids=32768))
    found = limits.condition(bounds, V1, uid_per_sandbox=True)
    assert "64 open files per process (rlimit)" in found.message
    assert "open files of all its processes together (32768 x 64)" in found.message.split("Not enforced")[1]


def test_the_condition_on_a_cgroup_v1_host_run_as_root() -> None:
    found = limits.condition(limits.Bounds.of(LocalDriverConfig()), V1, uid_per_sandbox=True)
    assert (found.type, found.status, found.reason) == ("ResourceLimits", "False", "CgroupUnavailable")
    assert found.message == (
        "enforced: /workspace 1Gi, /tmp 256Mi, /run 16Mi, /dev/shm 64Mi (tmpfs); file size 4Gi (rlimit); "
        "1024 open files per process (rlimit); 1024 processes (rlimit). "
        "Not enforced: memory 2Gi, cpu 1 (cgroup v1 host)."
    )


def test_the_condition_without_a_uid_per_sandbox_or_a_workspace_bound() -> None:
    config = LocalDriverConfig(workspace_size="", default_cpu="")
    found = limits.condition(limits.Bounds.of(config), V1, uid_per_sandbox=False)
    assert found.message.endswith(
        "Not enforced: /workspace disk use (local.workspace_size is empty), "
        "process count (sandboxes share the gateway's uid), memory 2Gi, cpu (no limit configured) (cgroup v1 host)."
    )


def test_the_condition_with_a_delegated_cgroup_v2() -> None:
    bounds = limits.Bounds.of(LocalDriverConfig()).for_spec(spec(memory="512Mi", pids=100))
    every = limits.condition(bounds, delegated("cpu", "memory", "pids"), uid_per_sandbox=False)
    assert (every.status, every.reason) == ("True", "Enforced")
    assert every.message.endswith("; 100 processes (cgroup v2); memory 512Mi (cgroup v2); cpu 1 (cgroup v2).")
    # Only what is delegated counts: without the cpu controller, cpu is named as not enforced.
    partly = limits.condition(bounds, delegated("memory", "pids"), uid_per_sandbox=True)
    assert (partly.status, partly.reason) == ("False", "PartlyEnforced")
    assert partly.message.endswith("memory 512Mi (cgroup v2). Not enforced: cpu 1.")
    # And without the pids controller the rlimit bounds the processes (a uid per sandbox).
    assert (
        "100 processes (rlimit)" in limits.condition(bounds, delegated("cpu", "memory"), uid_per_sandbox=True).message
    )


def test_requests_over_the_configured_maximum_are_refused() -> None:
    config = LocalDriverConfig(
        max_cpu="2", max_memory="1Gi", max_pids=500, max_storage_size="4Gi", default_memory="1Gi", max_processes=500
    )
    limits.check_maximum(spec(cpu="2", memory="1Gi", pids=500, storage=Storage(workspace="4Gi")), most(config))
    refusals = [
        (spec(cpu="2100m"), r"spec\.resources\.cpu: '2100m' is more than this gateway allows \(2000m\)"),
        (spec(memory="2Gi"), r"spec\.resources\.memory: '2Gi' is more than this gateway allows \(1Gi\)"),
        (spec(pids=501), r"spec\.resources\.pids: 501 is more than this gateway allows \(500\)"),
        (spec(storage=Storage(workspace="5Gi")), r"storage\.workspace: '5Gi' is more than this gateway allows \(4Gi\)"),
        (spec(storage=Storage(tmp="8Gi")), r"storage\.tmp: '8Gi' is more than this gateway allows \(4Gi\)"),
    ]
    for refused, message in refusals:
        with pytest.raises(InvalidArgumentError, match=message):
            limits.check_maximum(refused, most(config))
    # Unset maximums: the host's own size (storage is tmpfs: the host's memory).
    with pytest.raises(InvalidArgumentError, match=r"\(4000m\)"):
        limits.check_maximum(spec(cpu="5"), most(LocalDriverConfig(), host_cpus=4))
    with pytest.raises(
        InvalidArgumentError, match=r"storage\.workspace: '2Gi' is more than this gateway allows \(1Gi\)"
    ):
        limits.check_maximum(spec(storage=Storage(workspace="2Gi")), most(LocalDriverConfig(), 4, 2**30))
