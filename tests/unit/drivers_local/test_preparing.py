"""`preparing.Preparer`: a `[setup]` profile resolves to its built image, is Building while the
build runs, BuildFailed (with the build's message) after it fails, retried after a backoff that
doubles, and rebuilt at once when its setup changes."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from warmshell.core.profiles import Profile, ProfileError, Setup
from warmshell.drivers.local.pools import preparing
from warmshell.drivers.local.runtime import imageroots

BASE = "tools:1"


class Store:
    """Images by tag; `validate` pins them as the driver's admission does."""

    def __init__(self) -> None:
        self.images = {BASE}
        self.builds: list[str] = []
        self.fail_next = 0

    def validate(self, profile: Profile) -> Profile:
        if profile.image not in self.images:
            raise ProfileError(profile.source, "image", f"no image {profile.image!r}", reason=imageroots.NOT_FOUND)
        return dataclasses.replace(profile, image=f"{profile.image}@sha256:{len(profile.image):064x}")

    def build(self, profile: str, workspace: str, base: str, setup: Setup, tag: str) -> None:
        self.builds.append(tag)
        if self.fail_next:
            self.fail_next -= 1
            raise preparing.BuildError("step 1 (run 'make') exited 2; output ends: 'no rule'")
        self.images.add(tag)


def profile(*runs: str) -> Profile:
    return Profile(name="p", source="pools/p.toml", workspace="default", replicas=1, setup=Setup(BASE, runs))


async def resolved(preparer: preparing.Preparer, changed: asyncio.Event, wanted: Profile) -> Profile | ProfileError:
    """What `wanted` resolves to once the preparer says something changed."""
    await asyncio.wait_for(changed.wait(), 10)
    changed.clear()
    try:
        return preparer.resolve(wanted)
    except ProfileError as exc:
        return exc


async def test_building_then_built_then_rebuilt_on_a_changed_step() -> None:
    store, changed = Store(), asyncio.Event()
    preparer = preparing.Preparer(validate=store.validate, build=store.build, changed=changed.set)
    with pytest.raises(ProfileError) as building:
        preparer.resolve(profile("make"))
    assert building.value.reason == preparing.BUILDING
    assert "building image setup/p:" in str(building.value)
    done = await resolved(preparer, changed, profile("make"))
    assert isinstance(done, Profile)
    assert done.image.startswith(store.builds[0] + "@sha256:")
    assert preparer.resolve(profile("make")) == done  # built: nothing more is built
    assert len(store.builds) == 1
    with pytest.raises(ProfileError, match="building"):
        preparer.resolve(profile("make", "make test"))
    rebuilt = await resolved(preparer, changed, profile("make", "make test"))
    assert isinstance(rebuilt, Profile)
    assert rebuilt.image != done.image
    assert len(store.builds) == 2


async def test_a_failed_build_is_shown_and_retried_after_a_doubling_backoff() -> None:
    store, changed = Store(), asyncio.Event()
    store.fail_next = 2
    preparer = preparing.Preparer(validate=store.validate, build=store.build, changed=changed.set, retry_first=0.2)
    loop = asyncio.get_running_loop()
    with pytest.raises(ProfileError):
        preparer.resolve(profile("make"))
    failed = await resolved(preparer, changed, profile("make"))
    assert isinstance(failed, ProfileError)
    assert failed.reason == preparing.BUILD_FAILED
    assert "step 1 (run 'make') exited 2; output ends: 'no rule'" in str(failed)
    assert len(store.builds) == 1  # no retry before the backoff
    started = loop.time()
    retrying = await resolved(preparer, changed, profile("make"))  # the backoff's wake-up
    assert isinstance(retrying, ProfileError)
    assert retrying.reason == preparing.BUILDING
    assert "attempt 2" in str(retrying)
    assert loop.time() - started >= 0.15
    assert isinstance(await resolved(preparer, changed, profile("make")), ProfileError)  # failed again
    started = loop.time()
    await resolved(preparer, changed, profile("make"))  # the second backoff: twice as long
    assert loop.time() - started >= 0.35
    assert isinstance(await resolved(preparer, changed, profile("make")), Profile)
    assert len(store.builds) == 3


async def test_a_missing_base_names_setup_from() -> None:
    store = Store()
    store.images.clear()
    preparer = preparing.Preparer(validate=store.validate, build=store.build, changed=lambda: None)
    with pytest.raises(ProfileError) as caught:
        preparer.resolve(profile("make"))
    assert caught.value.key == "setup.from"
    assert caught.value.reason == imageroots.NOT_FOUND
    assert store.builds == []
