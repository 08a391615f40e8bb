import sys

import pytest

from kubesim.kubelet.images import ImageMap, ImageNotMapped, ImageRule


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
