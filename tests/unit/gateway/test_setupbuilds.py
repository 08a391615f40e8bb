"""`setupbuilds.measured`: every `[setup]` build is counted on /metrics (started, then succeeded or
failed with the step that failed) and timed."""

from __future__ import annotations

import pytest

from warmshell.core.profiles import Setup
from warmshell.drivers.local.pools.preparing import BuildError
from warmshell.gateway import metrics
from warmshell.gateway.setupbuilds import measured

SETUP = Setup(base="tools:1", runs=("true",))


def _count(profile: str, result: str, step: str = "") -> float:
    value = metrics.REGISTRY.get_sample_value(
        "warmshell_setup_builds_total", {"profile": profile, "result": result, "step": step}
    )
    return value or 0.0


def _timed(profile: str, result: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "warmshell_setup_build_seconds_count", {"profile": profile, "result": result}
    )
    return value or 0.0


def test_a_build_that_succeeds_is_counted_started_and_succeeded_and_timed() -> None:
    built: list[str] = []
    build = measured(lambda profile, workspace, base, setup, tag: built.append(tag))
    build("ok-profile", "default", "tools:1", SETUP, "setup/ok-profile:1")
    assert built == ["setup/ok-profile:1"]
    assert _count("ok-profile", "started") == 1
    assert _count("ok-profile", "succeeded") == 1
    assert _count("ok-profile", "failed") == 0
    assert _timed("ok-profile", "succeeded") == 1


def test_a_failed_step_is_counted_with_its_number_and_the_error_goes_on() -> None:
    def fails_at_step_3(profile: str, workspace: str, base: str, setup: Setup, tag: str) -> None:
        raise BuildError("step 3 (run 'exit 3') exited 3", step=3)

    with pytest.raises(BuildError, match="step 3"):
        measured(fails_at_step_3)("bad-profile", "default", "tools:1", SETUP, "setup/bad-profile:1")
    assert _count("bad-profile", "started") == 1
    assert _count("bad-profile", "failed", "3") == 1
    assert _count("bad-profile", "succeeded") == 0
    assert _timed("bad-profile", "failed") == 1


def test_a_build_that_fails_outside_its_steps_is_counted_without_a_step() -> None:
    def no_base(profile: str, workspace: str, base: str, setup: Setup, tag: str) -> None:
        raise BuildError("no image 'tools:1' in the image store")

    with pytest.raises(BuildError):
        measured(no_base)("nobase-profile", "default", "tools:1", SETUP, "setup/nobase-profile:1")
    assert _count("nobase-profile", "failed", "") == 1
