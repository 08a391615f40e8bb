"""What a spec means on the local driver, and the refusal without bubblewrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.core.models import Resources, SandboxSpec, Storage
from warmshell.core.profiles import ProfileError, parse_profile
from warmshell.drivers.base import ComputeDriver
from warmshell.drivers.local import LocalDriver, admission, cgroups, limits
from warmshell.drivers.local.hostsetup import HostSetup
from warmshell.drivers.local.launching import AGENT_BINARY


@pytest.fixture
def driver(tmp_path: Path) -> LocalDriver:
    # Unisolated so these tests run on hosts without bwrap too; validation does not care.
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True)
    return LocalDriver(config, StatePaths(tmp_path), cgroup=cgroups.Unavailable("test"))


def test_default_image_is_the_host_root(driver: LocalDriver) -> None:
    assert driver.default_image() == ""
    driver.validate("default", SandboxSpec())


def test_image_directory(driver: LocalDriver, tmp_path: Path) -> None:
    image = tmp_path / "rootfs"
    (image / "usr").mkdir(parents=True)
    driver.validate("default", SandboxSpec(image=str(image)))


@pytest.mark.parametrize("image", ["ubuntu:24.04", "relative/dir", "/nonexistent/rootfs"])
def test_bad_images(driver: LocalDriver, image: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        driver.validate("default", SandboxSpec(image=image))
    assert caught.value.field == "spec.image"
    assert "root filesystem" in caught.value.rule


def test_image_without_usr(driver: LocalDriver, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="usr"):
        driver.validate("default", SandboxSpec(image=str(tmp_path)))


def test_runtime_class_is_refused(driver: LocalDriver) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        driver.validate("default", SandboxSpec(runtime_class_name="gvisor"))
    assert caught.value.field == "spec.runtime_class_name"


def test_missing_bwrap_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(FailedPreconditionError, match=r"local\.allow_unisolated = true"):
        LocalDriver(LocalDriverConfig(bwrap="/nonexistent/bwrap"), StatePaths(tmp_path))


def test_it_is_a_compute_driver(driver: LocalDriver) -> None:
    assert isinstance(driver, ComputeDriver)
    assert driver.name == "local"
    assert driver.pools() == []


def test_a_profile_over_the_maximums_names_its_file_and_key(tmp_path: Path) -> None:
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True, max_cpu="1")
    host = HostSetup.of(config, StatePaths(tmp_path), agent=AGENT_BINARY, cgroup=cgroups.Unavailable("test"))
    text = 'version = 1\nworkspace = "default"\nreplicas = 1\n[resources]\ncpu = "1500m"\n'
    profile = parse_profile(text, name="big", source="/pools/big.toml", max_replicas=4)
    with pytest.raises(ProfileError) as caught:
        admission.check_profile(profile, host)
    assert (caught.value.source, caught.value.key) == ("/pools/big.toml", "resources.cpu")
    assert "'1500m' is more than this gateway allows (1000m)" in caught.value.rule
    within = parse_profile(text.replace("1500m", "1"), name="ok", source="/pools/ok.toml", max_replicas=4)
    admission.check_profile(within, host)


def test_the_maximums_are_read_once_when_the_driver_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = LocalDriverConfig(
        bwrap="/nonexistent/bwrap",
        allow_unisolated=True,
        max_cpu="2",
        max_memory="1Gi",
        max_storage_size="2Gi",
        default_memory="1Gi",
    )
    host = HostSetup.of(config, StatePaths(tmp_path), agent=AGENT_BINARY, cgroup=cgroups.Unavailable("test"))
    assert host.maximums == limits.Maximums(cpu_millis=2000, memory_bytes=2**30, pids=32768, storage_bytes=2**31)

    def unread(*_args: object, **_kwargs: object) -> int:
        raise AssertionError("a create re-read a configured maximum")

    monkeypatch.setattr(limits, "cpu_millis", unread)
    monkeypatch.setattr(limits, "memory_bytes", unread)
    asked = SandboxSpec(resources=Resources(cpu="2", memory="1Gi"), storage=Storage(workspace="2Gi"))
    for _ in range(3):
        admission.check_spec(asked, host)
    with pytest.raises(InvalidArgumentError, match=r"spec\.resources\.memory: '2Gi' .* \(1Gi\)"):
        admission.check_spec(SandboxSpec(resources=Resources(memory="2Gi")), host)
