"""Merge patch, JSON patch and strategic merge patch."""

from __future__ import annotations

import pytest

from kubesim.apiserver import errors, patching


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "l": [3], "n": {"x": 1}}
    assert patching.merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}}
    assert target["c"] == {"d": "e", "f": "g"}  # the input is not modified


def test_json_patch_operations() -> None:
    doc = {"metadata": {"labels": {"a": "1"}}, "list": [1, 2, 3]}
    ops = [
        {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
        {"op": "remove", "path": "/list/0"},
        {"op": "replace", "path": "/list/0", "value": 9},
        {"op": "add", "path": "/list/-", "value": 4},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/copied"},
        {"op": "move", "from": "/copied", "path": "/moved"},
        {"op": "test", "path": "/moved", "value": "1"},
    ]
    assert patching.json_patch(doc, ops) == {
        "metadata": {"labels": {"a": "1", "b/c": "2"}},
        "list": [9, 3, 4],
        "moved": "1",
    }


def test_json_patch_failed_test_is_invalid() -> None:
    with pytest.raises(errors.ApiError) as exc:
        patching.json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    assert exc.value.code == 422


def test_json_patch_remove_missing_path() -> None:
    with pytest.raises(errors.ApiError) as exc:
        patching.json_patch({"a": 1}, [{"op": "remove", "path": "/b"}])
    assert exc.value.code == 422


def test_strategic_merge_keyed_lists_and_directives() -> None:
    pod = {
        "metadata": {"finalizers": ["a"]},
        "spec": {
            "containers": [
                {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "s1"},
            ],
            "tolerations": [{"key": "x"}],
        },
    }
    patch = {
        "metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
            "containers": [
                {"name": "main", "image": "v2", "env": [{"name": "B", "value": "2"}]},
                {"name": "side", "$patch": "delete"},
            ],
            "tolerations": [{"key": "y"}],
        },
    }
    out = patching.strategic_merge(pod, patch)
    assert out["metadata"]["finalizers"] == ["b"]
    assert out["spec"]["containers"] == [
        {"name": "main", "image": "v2", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    ]
    assert out["spec"]["tolerations"] == [{"key": "y"}]  # no merge key: replaced


def test_strategic_merge_replace_directive() -> None:
    out = patching.strategic_merge({"data": {"a": "1", "b": "2"}}, {"data": {"$patch": "replace", "c": "3"}})
    assert out == {"data": {"c": "3"}}


def test_merge_patch_leaves_its_target_alone() -> None:
    # The patch's values are taken as they are; the target (a stored object's copy) is not edited.
    target = {"a": {"b": 1}, "l": [1]}
    patched = patching.merge_patch(target, {"a": {"c": 2}, "l": [2, 3]})
    assert patched == {"a": {"b": 1, "c": 2}, "l": [2, 3]}
    assert target == {"a": {"b": 1}, "l": [1]}
