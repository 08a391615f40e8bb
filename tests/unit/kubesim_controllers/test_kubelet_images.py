import pathlib
import sys

import pytest

from kubesim.kubelet.images import ImageMap, ImageNotMapped, ImageRule, runtime_binds


def test_command_replaces_the_entrypoint_like_a_runtime() -> None:
    images = ImageMap()
    assert images.argv({"image": "busybox:1.36", "command": ["sleep"], "args": ["5"]}) == ["sleep", "5"]
    assert images.argv({"image": "busybox", "args": ["-c", "true"]}) == ["sh", "-c", "true"]


def test_override_rule_always_runs_its_entrypoint() -> None:
    images = ImageMap(
        {
            "ghcr.io/warmshell/warmshell:*": {
                "entrypoint": [sys.executable, "-m", "warmshell", "supervisor"],
                "overrideCommand": True,
            }
        }
    )
    argv = images.argv({"image": "ghcr.io/warmshell/warmshell:0.1", "command": ["warmshell"], "args": ["--x"]})
    assert argv == [sys.executable, "-m", "warmshell", "supervisor", "--x"]


def test_caller_rules_win_over_defaults() -> None:
    images = ImageMap({"busybox*": ImageRule(("echo",))})
    assert images.argv({"image": "busybox", "args": ["hi"]}) == ["echo", "hi"]


def test_unmapped_image_without_command_cannot_start() -> None:
    with pytest.raises(ImageNotMapped):
        ImageMap().argv({"image": "example.com/unknown:1"})
    assert ImageMap().argv({"image": "example.com/unknown:1", "command": ["true"]}) == ["true"]


def test_from_file(tmp_path: "pytest.TempPathFactory") -> None:
    path = tmp_path / "images.yaml"  # type: ignore[operator]
    path.write_text("'example.com/agent:*': ['python3', '-c', 'print(1)']\n")
    assert ImageMap.from_file(path).argv({"image": "example.com/agent:2"}) == ["python3", "-c", "print(1)"]


def test_runtime_paths_hidden_by_a_volume_are_bound_back_outermost_first(tmp_path: pathlib.Path) -> None:
    # A checkout and its virtualenv under a directory the chart mounts an emptyDir on (/tmp).
    venv, src, lib = tmp_path / "repo" / ".venv", tmp_path / "repo" / "src", tmp_path / "repo" / ".venv" / "lib"
    for d in (venv, src, lib):
        d.mkdir(parents=True)
    runtime = [str(venv), "/usr", str(lib), str(src), "", str(tmp_path / "missing")]
    assert runtime_binds([str(tmp_path)], runtime) == sorted([str(venv), str(src)])
    # Nothing is hidden when no mount covers them; a path at or above a target is never rebound.
    assert runtime_binds(["/etc/warmshell"], runtime) == []
    assert runtime_binds([str(venv)], [str(venv), str(tmp_path)]) == []


def test_the_image_runs_its_own_program_only_from_its_entrypoint_or_programs() -> None:
    rule = ImageMap().rule_for("ghcr.io/warmshell/warmshell:1")
    assert rule is not None
    images = ImageMap()
    supervisor = images.argv({"image": "ghcr.io/warmshell/warmshell:1"})
    init = images.argv({"image": "ghcr.io/warmshell/warmshell:1", "command": ["warmshell"], "args": ["install-agent"]})
    assert rule.runs_own_program(supervisor)
    assert rule.runs_own_program(init)  # a program of the image: forked like the entrypoint
    # A command the pod brings, even one naming this interpreter, is the pod's, not the image's.
    assert not rule.runs_own_program(["python3", "-m", "warmshell", "install-agent"])
    assert not rule.runs_own_program([sys.executable, "-m", "evil"])
    assert not ImageRule().runs_own_program([])  # an empty entrypoint is no prefix of everything


def test_the_warmshell_image_has_the_built_agent_on_its_path() -> None:
    """The init container the driver renders (`warmshell-agent --install DIR`) runs the agent
    built beside the warmshell package, as the image's PATH has it."""
    from warmshell.drivers.local.runtime.agent.installing import BUILT_AGENT

    argv = ImageMap().argv(
        {"image": "ghcr.io/warmshell/warmshell:1", "command": ["warmshell-agent"], "args": ["--install", "/d"]}
    )
    assert argv == [str(BUILT_AGENT), "--install", "/d"]
    assert BUILT_AGENT.is_file()
