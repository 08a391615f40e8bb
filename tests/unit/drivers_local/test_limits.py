"""The local sandbox's default bounds: the prlimit prefix, the condition, the configured maximum."""

from __future__ import annotations

import pytest

from warmshell.core.config import LocalDriverConfig
from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import Resources, SandboxSpec
from warmshell.drivers.local import cgroups, limits

HUGE_HOST = {"host_cpus": 64, "host_memory": 2**40}


def spec(**resources: str) -> SandboxSpec:
    return SandboxSpec(resources=Resources(**resources))


def test_the_process_bound_needs_a_uid_per_sandbox() -> None:
    shared = limits.Bounds.of(LocalDriverConfig(), uid_per_sandbox=False)
    own = limits.Bounds.of(LocalDriverConfig(max_processes=99), uid_per_sandbox=True)
    assert limits.prlimit_argv(shared) == [limits.PRLIMIT, f"--fsize={4 * 2**30}", "--"]
    assert limits.prlimit_argv(own) == [limits.PRLIMIT, f"--fsize={4 * 2**30}", "--nproc=99", "--"]
    message = limits.condition(shared, cgroups.Unavailable("cgroup v1 host")).message
    assert "Not enforced: /workspace disk use, process count (sandboxes share the gateway's uid)" in message
    assert message.endswith("memory and cpu (cgroup v1 host).")


def test_requests_over_the_configured_maximum_are_refused() -> None:
    config = LocalDriverConfig(max_cpu="2", max_memory="1Gi")
    limits.check_maximum(spec(cpu="2", memory="1Gi"), config, **HUGE_HOST)
    with pytest.raises(InvalidArgumentError, match=r"cpu: '2100m' is more than this gateway allows \(2000m\)"):
        limits.check_maximum(spec(cpu="2100m"), config, **HUGE_HOST)
    with pytest.raises(InvalidArgumentError, match=r"spec\.resources\.memory: '2Gi' is more than this gateway allows"):
        limits.check_maximum(spec(memory="2Gi"), config, **HUGE_HOST)
    # Unset maximum: the host's own size.
    with pytest.raises(InvalidArgumentError, match=r"\(4000m\)"):
        limits.check_maximum(spec(cpu="5"), LocalDriverConfig(), host_cpus=4, host_memory=2**40)
