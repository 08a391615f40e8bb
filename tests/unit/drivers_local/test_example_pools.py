"""The shipped example profiles parse and match the creates they are documented for."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.core.matching import Match, PoolIndex
from warmshell.drivers.local.pools import reloading

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "pools"


def test_examples_parse_and_match_their_creates() -> None:
    profiles, errors = reloading.load(EXAMPLES, max_replicas=64)
    assert errors == {}
    assert set(profiles) == {"default", "env-foo", "cpu", "agent-tasks"}
    # The local driver's default image is "" (the host root).
    expected = {
        "default": SandboxShape("default", ""),
        "env-foo": SandboxShape("default", "", {"FOO": "bar"}),
        "cpu": SandboxShape("default", "", cpu_millis=200),
        "agent-tasks": SandboxShape("default", "", {"AGENT": "coder"}, accepted=("RUN_*", "TASK_ID")),
    }
    for name, shape in expected.items():
        assert profiles[name].fingerprint("") == fingerprint(shape), name
    assert len({p.fingerprint("") for p in profiles.values()}) == 4
    # The documented create goes warm on agent-tasks alone: its accepted keys leave the match.
    index = PoolIndex(
        ((p.fingerprint(""), n) for n, p in profiles.items()), accepts=lambda n: profiles[n].accepted_environment
    )
    request = SandboxShape("default", "", {"AGENT": "coder", "TASK_ID": "17", "RUN_ATTEMPT": "2"})
    assert index.match(request) == Match("agent-tasks", ("RUN_ATTEMPT", "TASK_ID"))
    assert index.match(SandboxShape("default", "", {"FOO": "bar"})) == Match("env-foo")


@pytest.mark.parametrize("bad", ["version = 2\n", "{{{"])
def test_load_reports_invalid_files_beside_valid_ones(tmp_path: Path, bad: str) -> None:
    (tmp_path / "good.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 1\n')
    (tmp_path / "bad.toml").write_text(bad)
    (tmp_path / ".hidden.toml").write_text(bad)
    (tmp_path / "notes.txt").write_text(bad)
    profiles, errors = reloading.load(tmp_path, max_replicas=4)
    assert set(profiles) == {"good"}
    assert set(errors) == {"bad"}
    assert str(tmp_path / "bad.toml") in str(errors["bad"])


def test_snapshot_changes_with_content(tmp_path: Path) -> None:
    assert reloading.snapshot(tmp_path / "missing") == frozenset()
    path = tmp_path / "p.toml"
    path.write_text("a")
    first = reloading.snapshot(tmp_path)
    path.write_text("ab")
    assert reloading.snapshot(tmp_path) != first
