"""An older tree under a Kubernetes benchmark renders its own parts (`bench/treeparts.py`): its
driver settings, pool template and kubesim image rules come from its code, not the running one's
(this tree's settings refused by an older gateway, this tree's init container unknown to its pods,
was what kept `bench/replicas.py --before-src` from running trees before issue 35's pod changes)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import treeparts

ROOT = Path(__file__).resolve().parents[2]

_OLDER_IMAGE = "ghcr.io/warmshell/warmshell:older"


def _older_tree(base: Path) -> Path:
    """A copy of this tree, as `git archive` gives it (no agent built), made different where a
    benchmark must follow it: a driver setting of its own, another image."""
    ignore = shutil.ignore_patterns("__pycache__", "warmshell-agent", "warmshell-launch", "*.so")
    shutil.copytree(ROOT / "src", base / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", base / "tests", ignore=ignore)
    config = base / "src" / "warmshell" / "core" / "config.py"
    marked = config.read_text().replace(
        "class KubernetesDriverConfig(_Section):\n",
        'class KubernetesDriverConfig(_Section):\n    older_setting: str = "kept"\n',
    )
    config.write_text(marked)
    conftest = base / "tests" / "integration" / "drivers_kubernetes" / "conftest.py"
    conftest.write_text(
        conftest.read_text().replace('IMAGE = "ghcr.io/warmshell/warmshell:test"', f'IMAGE = "{_OLDER_IMAGE}"')
    )
    return base / "src"


def test_an_older_tree_renders_its_settings_pool_and_image_rules_with_its_own_code(tmp_path: Path) -> None:
    src = _older_tree(tmp_path / "older")
    tree = treeparts.tree_parts(str(src))
    tree.render(
        kubeconfig="/nowhere/kubeconfig",
        gateway_address="127.0.0.1:1",
        api_timeout_seconds=7.0,
        name="bench",
        environment={"FOO": "bar"},
    )
    settings = tree.config.model_dump()
    assert settings["older_setting"] == "kept"  # the tree's own config model
    assert (settings["image"], settings["api_timeout_seconds"]) == (_OLDER_IMAGE, 7.0)
    template, pool = tree.pool_pair(5)
    assert pool["spec"]["replicas"] == 5
    assert pool["metadata"]["name"] == template["metadata"]["name"] == "bench"
    images = [c["image"] for c in template["spec"]["podTemplate"]["spec"]["containers"]]
    assert _OLDER_IMAGE in images
    assert tree.image == _OLDER_IMAGE
    rule = tree.images["ghcr.io/warmshell/*"]
    assert str(tmp_path / "older") in str(rule)  # its pod shim or its agent, not this tree's
    # The archived tree had no agent: its pods copy the one built in it.
    assert (src / "warmshell" / "drivers" / "local" / "runtime" / "agent" / "warmshell-agent").is_file()
    # Each call hands out its own copies: the replica helper pops from the settings.
    settings.pop("image")
    assert tree.config.model_dump()["image"] == _OLDER_IMAGE


def test_a_tree_without_its_tests_is_refused_naming_the_option(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(SystemExit, match="--before-src"):
        treeparts.tree_parts(str(tmp_path / "src"))
