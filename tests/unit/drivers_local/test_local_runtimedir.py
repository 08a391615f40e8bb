"""Where a root gateway's runtime directory is (`runtimedir.choose`) and when one is abandoned
(`holding.abandoned`): pure decisions."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from warmshell.drivers.local.runtime import holding, runtimedir

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
tmpfs /run/user/1000 tmpfs rw 0 0
tmpfs /mnt/with\\040space tmpfs rw 0 0
"""
SANDBOXES = Path("/var/lib/warmshell-sandboxes")


def test_tmpfs_mount_points_are_read_from_the_mounts_table() -> None:
    found = runtimedir.tmpfs_mount_points(MOUNTS)
    assert found == {Path("/dev/shm"), Path("/run/user/1000"), Path("/mnt/with space")}


def test_run_is_preferred_then_dev_shm_then_the_sandbox_directory() -> None:
    both = {Path("/run"), Path("/dev/shm")}
    assert runtimedir.choose(None, SANDBOXES, both).parent == Path("/run")
    assert runtimedir.choose(None, SANDBOXES, {Path("/dev/shm")}).parent == Path("/dev/shm")
    assert runtimedir.choose(None, SANDBOXES, {Path("/run/user/1000")}) == SANDBOXES  # no tmpfs of the host's
    assert runtimedir.choose(Path("/srv/rt"), SANDBOXES, both) == Path("/srv/rt")  # the key wins


@given(st.lists(st.from_regex(r"/[a-z0-9/_-]{1,30}", fullmatch=True), min_size=2, max_size=2, unique=True))
def test_gateways_share_a_runtime_directory_exactly_when_they_share_a_sandbox_directory(dirs: list[str]) -> None:
    first, second = (Path(d) for d in dirs)
    tmpfs = {Path("/dev/shm")}
    assert runtimedir.choose(None, first, tmpfs) == runtimedir.choose(None, first, tmpfs)
    if first != second:  # two spellings of one path aside ("/a/" and "/a" are one Path)
        assert runtimedir.choose(None, first, tmpfs) != runtimedir.choose(None, second, tmpfs)


@given(st.from_regex(r"/[a-z0-9/_-]{1,30}", fullmatch=True), st.from_regex(r"/[a-z0-9/_-]{1,30}", fullmatch=True))
def test_a_directory_is_abandoned_only_under_its_owners_name_with_its_owner_gone(recorded: str, other: str) -> None:
    named = runtimedir.runtime_named
    name = named(Path(recorded))
    assert holding.abandoned(name, Path(recorded), exists=False, named=named)
    assert not holding.abandoned(name, Path(recorded), exists=True, named=named)
    assert not holding.abandoned(name, None, exists=False, named=named)  # an older gateway's: no record
    assert not holding.abandoned(name, Path(recorded), exists=False, named=runtimedir.gateway_named)
    if Path(other) != Path(recorded):  # a record copied under another directory's name
        assert not holding.abandoned(name, Path(other), exists=False, named=named)


def test_a_gateways_name_is_the_one_its_cgroups_and_etc_directory_are_named_by() -> None:
    state = Path("/var/lib/warmshell")
    assert runtimedir.gateway_named(state) == runtimedir.GATEWAY_PREFIX + runtimedir.digest_of(state)
    assert runtimedir.runtime_named(SANDBOXES) == runtimedir.named_for(SANDBOXES, Path("/run")).name
