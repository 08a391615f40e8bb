"""What a spec means on the local driver, and the refusal without bubblewrap."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import FailedPreconditionError, InvalidArgumentError
from warmshell.core.models import Resources, SandboxSpec, Storage
from warmshell.core.profiles import ProfileError, parse_profile
from warmshell.drivers.base import ComputeDriver
from warmshell.drivers.local import LocalDriver, admission
from warmshell.drivers.local.hostsetup import HostSetup
from warmshell.drivers.local.runtime import cgroups, cgroups_v1, limits
from warmshell.drivers.local.runtime.launching import AGENT_BINARY


@pytest.fixture
def images(tmp_path: Path) -> Path:
    (tmp_path / "images").mkdir()
    return tmp_path / "images"


@pytest.fixture
def driver(tmp_path: Path, images: Path) -> LocalDriver:
    # Unisolated so these tests run on hosts without bwrap too; validation does not care.
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True, image_roots=[images])
    return LocalDriver(config, StatePaths(tmp_path / "state"), cgroup=cgroups.Unavailable("test"))


def rootfs(path: Path) -> Path:
    (path / "usr").mkdir(parents=True)
    return path


def test_default_image_is_the_host_root(driver: LocalDriver) -> None:
    assert driver.default_image() == ""
    driver.validate("default", SandboxSpec())


def test_image_directory(driver: LocalDriver, images: Path) -> None:
    driver.validate("default", SandboxSpec(image=str(rootfs(images / "debian"))))
    driver.validate("default", SandboxSpec(image=str(rootfs(images / "team" / "python"))))


def test_an_image_outside_the_image_roots_is_refused_naming_the_field_and_the_key(
    driver: LocalDriver, images: Path, tmp_path: Path
) -> None:
    outside = rootfs(tmp_path / "elsewhere")
    (images / "escape").symlink_to(outside)  # a link inside a root counts where it leads
    rootfs(images / "debian")
    rules = set()
    for image in (outside, tmp_path / "no-such", images / "escape", images / ".." / "elsewhere", images, Path("/")):
        with pytest.raises(InvalidArgumentError) as caught:
            driver.validate("default", SandboxSpec(image=str(image)))
        assert caught.value.field == "spec.image"
        assert "local.image_roots" in caught.value.rule
        assert repr(str(images)) in caught.value.rule
        rules.add(caught.value.rule.removeprefix(repr(str(image))))
    # Existing or not, a directory or a link: the same answer, so nothing is learnt of the host.
    assert len(rules) == 1, rules
    assert "root filesystem" in rules.pop()


def test_without_image_roots_only_the_host_root_is_an_image(tmp_path: Path) -> None:
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True)
    driver = LocalDriver(config, StatePaths(tmp_path / "state"), cgroup=cgroups.Unavailable("test"))
    driver.validate("default", SandboxSpec())
    with pytest.raises(InvalidArgumentError) as caught:
        driver.validate("default", SandboxSpec(image=str(rootfs(tmp_path / "debian"))))
    assert caught.value.field == "spec.image"
    assert "local.image_roots is empty" in caught.value.rule


@pytest.mark.parametrize(("roots", "rule"), [(["/"], "any host directory"), (["images"], "absolute path")])
def test_an_image_root_must_be_absolute_and_not_the_host_root(roots: list[str], rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        LocalDriverConfig(image_roots=roots)  # type: ignore[arg-type]


def test_an_image_root_may_not_overlap_the_state_dir(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "state", tmp_path / "state" / "images"):
        config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True, image_roots=[root])
        with pytest.raises(FailedPreconditionError, match=r"local\.image_roots"):
            LocalDriver(config, StatePaths(tmp_path / "state"), cgroup=cgroups.Unavailable("test"))


def test_bad_images(driver: LocalDriver) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        driver.validate("default", SandboxSpec(image="/nonexistent/rootfs"))
    assert caught.value.field == "spec.image"
    assert "root filesystem" in caught.value.rule


@pytest.mark.parametrize("image", ["ubuntu:24.04", "relative/dir"])
def test_images_of_the_store_need_bubblewrap(driver: LocalDriver, image: str) -> None:
    # Not a path: a reference to the image store, whose overlay only an isolated sandbox gets.
    with pytest.raises(FailedPreconditionError, match=r"^spec\.image: .*need bubblewrap"):
        driver.validate("default", SandboxSpec(image=image))


def test_image_without_usr(driver: LocalDriver, images: Path) -> None:
    (images / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="usr"):
        driver.validate("default", SandboxSpec(image=str(images / "empty")))


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
    config = LocalDriverConfig(
        bwrap="/nonexistent/bwrap", allow_unisolated=True, max_cpu="1", allow_unenforced_limits=True
    )
    host = HostSetup.of(config, StatePaths(tmp_path), agent=AGENT_BINARY, cgroup=cgroups.Unavailable("test"))
    text = 'version = 1\nworkspace = "default"\nreplicas = 1\n[resources]\ncpu = "1500m"\n'
    profile = parse_profile(text, name="big", source="/pools/big.toml", max_replicas=4)
    with pytest.raises(ProfileError) as caught:
        admission.check_profile(profile, host)
    assert (caught.value.source, caught.value.key) == ("/pools/big.toml", "resources.cpu")
    assert "'1500m' is more than this gateway allows (1000m)" in caught.value.rule
    within = parse_profile(text.replace("1500m", "1"), name="ok", source="/pools/ok.toml", max_replicas=4)
    admission.check_profile(within, host)


def test_a_profile_naming_an_image_outside_the_roots_names_its_file_and_key(tmp_path: Path, images: Path) -> None:
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True, image_roots=[images])
    host = HostSetup.of(config, StatePaths(tmp_path / "state"), agent=AGENT_BINARY, cgroup=cgroups.Unavailable("t"))
    outside = rootfs(tmp_path / "elsewhere")
    text = f'version = 1\nworkspace = "default"\nreplicas = 1\nimage = "{outside}"\n'
    profile = parse_profile(text, name="img", source="/pools/img.toml", max_replicas=4)
    with pytest.raises(ProfileError) as caught:
        admission.check_profile(profile, host)
    assert (caught.value.source, caught.value.key) == ("/pools/img.toml", "image")
    assert "local.image_roots" in caught.value.rule
    inside = str(rootfs(images / "debian"))
    admission.check_profile(
        parse_profile(text.replace(str(outside), inside), name="ok", source="/p.toml", max_replicas=4), host
    )


def test_the_maximums_are_read_once_when_the_driver_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = LocalDriverConfig(
        bwrap="/nonexistent/bwrap",
        allow_unisolated=True,
        max_cpu="2",
        max_memory="1Gi",
        max_storage_size="2Gi",
        default_memory="1Gi",
        allow_unenforced_limits=True,
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


def test_a_limit_this_host_cannot_enforce_is_refused_naming_the_field(tmp_path: Path) -> None:
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True)
    host = HostSetup.of(config, StatePaths(tmp_path), agent=AGENT_BINARY, cgroup=cgroups.Unavailable("no cgroups"))
    admission.check_spec(SandboxSpec(), host)  # the configured defaults stay best-effort
    for resources, field in (
        (Resources(memory="512Mi"), "spec.resources.memory"),
        (Resources(cpu="500m"), "spec.resources.cpu"),
        (Resources(pids=64), "spec.resources.pids"),
    ):
        # (unisolated here, so that it runs without bwrap: nothing is bounded; see test_local_cold)
        unisolated = r"\(local\.allow_unisolated: no bounds at all\)"
        with pytest.raises(FailedPreconditionError, match=rf"^{field}: this host cannot enforce it {unisolated}"):
            admission.check_spec(SandboxSpec(resources=resources), host)
    text = 'version = 1\nworkspace = "default"\nreplicas = 1\n[resources]\nmemory = "1Gi"\n'
    with pytest.raises(ProfileError) as caught:
        admission.check_profile(parse_profile(text, name="m", source="/pools/m.toml", max_replicas=4), host)
    assert (caught.value.source, caught.value.key) == ("/pools/m.toml", "resources.memory")
    assert "local.allow_unenforced_limits = true" in caught.value.rule
    allowed = dataclasses.replace(host, allow_unenforced_limits=True)
    admission.check_spec(SandboxSpec(resources=Resources(memory="512Mi", cpu="1", pids=64)), allowed)


def test_what_a_host_can_enforce() -> None:
    v1 = cgroups_v1.CgroupV1({"memory": Path("/m"), "freezer": Path("/f")})
    assert limits.enforceable(v1, isolated=True, uid_per_sandbox=False) == {"memory"}
    assert limits.enforceable(v1, isolated=True, uid_per_sandbox=True) == {"memory", "pids"}  # by rlimit
    assert limits.enforceable(v1, isolated=False, uid_per_sandbox=True) == set()  # unisolated: nothing
    assert limits.unenforced_field(SandboxSpec(resources=Resources(memory="1Gi", pids=64)), frozenset({"memory"})) == (
        "spec.resources.pids"
    )
    assert limits.unenforced_field(SandboxSpec(), frozenset()) is None


@pytest.mark.parametrize(
    ("release", "refused"),
    [
        ("6.18.44-fc-v1272", False),
        ("5.11.0", False),
        ("5.15.0-91-generic", False),
        ("5.10.0-28-amd64", True),
        ("4.19.0", True),
    ],
)
def test_a_gateway_of_a_normal_user_runs_stored_images_from_linux_5_11(release: str, refused: bool) -> None:
    why = admission.userns_overlay_refused(release)
    assert (why is not None) == refused
    if why is not None:
        assert release in why
        assert "5.11" in why
