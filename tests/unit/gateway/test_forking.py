"""What a fork makes of its parent (`gateway.forking`): names, and each child's create."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.errors import InvalidArgumentError
from warmshell.core.models import Lifetime, SandboxRecord, SandboxSpec
from warmshell.gateway.forking import child_names, child_sandbox


def test_children_are_numbered_under_the_prefix_or_the_parents_name() -> None:
    assert child_names("prep", "", 3, most=5) == ["prep-fork-1", "prep-fork-2", "prep-fork-3"]
    assert child_names("prep", "try", 1, most=5) == ["try-1"]


@given(st.integers(min_value=-5, max_value=40))
def test_a_count_outside_one_to_the_most_is_refused_naming_count(count: int) -> None:
    if 1 <= count <= 32:
        assert len(child_names("p", "", count, most=32)) == count
    else:
        with pytest.raises(InvalidArgumentError, match=r"^count: .*local\.max_fork_count"):
            child_names("p", "", count, most=32)


def test_a_prefix_that_makes_no_sandbox_name_is_refused_naming_prefix() -> None:
    for prefix in ("Bad", "a_b", "x" * 70, "-lead"):
        with pytest.raises(InvalidArgumentError, match=r"^prefix: "):
            child_names("p", prefix, 2, most=5)


def _parent() -> SandboxRecord:
    spec = SandboxSpec(
        image="tiny:1@sha256:" + "a" * 64,
        environment={"A": "1"},
        command=["/bin/sh"],
        secret_names=["TOKEN"],
        secret_hosts={"TOKEN": ["api.example.com"]},
    )
    return SandboxRecord(
        id="sb-1",
        name="prep",
        workspace="team",
        labels={"k": "v"},
        spec=spec,
        lifetime=Lifetime(ttl_seconds=600, idle_timeout_seconds=60),
    )


def test_a_child_is_the_parents_spec_on_its_snapshot_without_its_secrets_unless_asked() -> None:
    parent = _parent()
    child = child_sandbox(parent, "prep-fork-1", "sha256:" + "b" * 64, None)
    assert (child.workspace, child.name, dict(child.labels)) == ("team", "prep-fork-1", {"k": "v"})
    assert child.spec.image == "sha256:" + "b" * 64
    assert (child.spec.environment, child.spec.command) == ({"A": "1"}, ["/bin/sh"])
    assert (child.spec.secret_names, child.spec.secret_hosts, dict(child.secrets)) == ([], {}, {})
    assert (child.ttl_seconds, child.idle_timeout_seconds) == (600, 60)
    assert parent.spec.image.startswith("tiny:1")  # the parent's record is not changed
    assert (parent.spec.secret_names, parent.spec.secret_hosts) == (["TOKEN"], {"TOKEN": ["api.example.com"]})
    kept = child_sandbox(parent, "prep-fork-2", "sha256:" + "b" * 64, {"TOKEN": "s3cret"})
    assert (kept.spec.secret_names, dict(kept.secrets)) == (["TOKEN"], {"TOKEN": "s3cret"})
