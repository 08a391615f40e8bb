"""`kubesim.kubelet.poddir.remove`: a pod directory goes whole, and nothing outside it does."""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.kubelet import poddir

_NAMES = st.sampled_from(["a", "b", ".c", "token", "..data", "m"])
# A tree: a name maps to file contents (bytes) or to a subtree.
_TREES = st.recursive(
    st.binary(max_size=16),
    lambda children: st.dictionaries(_NAMES, children, max_size=4),
    max_leaves=12,
)


def _build(root: pathlib.Path, tree: dict[str, object]) -> None:
    root.mkdir()
    for name, node in tree.items():
        if isinstance(node, dict):
            _build(root / name, node)
        else:
            assert isinstance(node, bytes)
            (root / name).write_bytes(node)


def _outside(base: pathlib.Path) -> pathlib.Path:
    outside = base / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "keep").write_text("precious")
    (outside / "file").write_text("precious")
    return outside


def _intact(outside: pathlib.Path) -> bool:
    return (outside / "dir" / "keep").read_text() == "precious" and (outside / "file").read_text() == "precious"


@settings(max_examples=60, deadline=None)
@given(tree=st.dictionaries(_NAMES, _TREES, max_size=5))
def test_every_tree_goes_whole(tree: dict[str, object]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pod = pathlib.Path(tmp) / "pod"
        _build(pod, tree)
        poddir.remove(pod)
        assert os.listdir(tmp) == []


def test_symlinks_inside_are_removed_not_followed(tmp_path: pathlib.Path) -> None:
    outside = _outside(tmp_path)
    pod = tmp_path / "pod"
    (pod / ".volumes" / "v0").mkdir(parents=True)
    (pod / "m").mkdir()
    (pod / "m" / "0").symlink_to(pod / ".volumes" / "v0", target_is_directory=True)
    (pod / ".volumes" / "v0" / "escape-dir").symlink_to(outside / "dir", target_is_directory=True)
    (pod / ".volumes" / "v0" / "escape-file").symlink_to(outside / "file")
    (pod / "dangling").symlink_to(tmp_path / "nowhere")
    poddir.remove(pod)
    assert not pod.exists()
    assert _intact(outside)


def test_a_pod_directory_that_is_a_symlink_is_left(tmp_path: pathlib.Path) -> None:
    outside = _outside(tmp_path)
    pod = tmp_path / "pod"
    pod.symlink_to(outside, target_is_directory=True)
    poddir.remove(pod)
    assert _intact(outside)
    assert pod.is_symlink()


def test_a_missing_directory_is_not_an_error(tmp_path: pathlib.Path) -> None:
    poddir.remove(tmp_path / "never-made")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_swapped_for_a_symlink_after_the_scan_is_not_followed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race rmtree guards against: the scan saw a directory, a container then put a symlink
    to the outside in its place. The walk's open refuses the symlink; the rest of the pod goes."""
    outside = _outside(tmp_path)
    pod = tmp_path / "pod"
    (pod / "v").mkdir(parents=True)
    (pod / "v" / "swapped").symlink_to(outside / "dir", target_is_directory=True)
    (pod / "v" / "plain").write_text("x")
    monkeypatch.setattr(poddir, "_is_dir", lambda entry: entry.name == "swapped" or entry.is_dir(follow_symlinks=False))
    poddir.remove(pod)
    assert _intact(outside)
    assert sorted(p.name for p in pod.rglob("*")) == ["swapped", "v"]
