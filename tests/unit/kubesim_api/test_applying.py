"""Server-side apply: merging, removal of fields a manager stopped applying, conflicts."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.apiserver import applying, errors


def cm(data: dict[str, str], **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": labels}, "data": data}


def test_apply_then_reapply_with_fewer_fields() -> None:
    live = applying.apply(None, cm({"a": "1", "b": "2"}, x="1"), manager="m", force=False, api_version="v1")
    assert live["metadata"]["managedFields"][0]["manager"] == "m"
    live = applying.apply(live, cm({"a": "1"}), manager="m", force=False, api_version="v1")
    assert live["data"] == {"a": "1"}
    assert live["metadata"]["labels"] == {}


def test_fields_of_other_managers_survive_and_conflict() -> None:
    live = applying.apply(None, cm({"a": "1"}), manager="one", force=False, api_version="v1")
    live = applying.apply(live, cm({"b": "2"}), manager="two", force=False, api_version="v1")
    assert live["data"] == {"a": "1", "b": "2"}
    with pytest.raises(errors.ApiError) as exc:
        applying.apply(live, cm({"a": "changed"}), manager="two", force=False, api_version="v1")
    assert exc.value.code == 409
    assert 'conflict with "one": .data.a' in exc.value.message
    forced = applying.apply(live, cm({"a": "changed", "b": "2"}), manager="two", force=True, api_version="v1")
    assert forced["data"]["a"] == "changed"
    owners = {e["manager"]: e["fieldsV1"] for e in forced["metadata"]["managedFields"]}
    assert "one" not in owners  # it lost its only field


def test_keyed_lists_merge_by_name() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "1"}]},
    }
    live = applying.apply(None, pod, manager="m", force=False, api_version="v1")
    live["spec"]["containers"].append({"name": "b", "image": "2"})  # someone else's container
    out = applying.apply(
        live, {**pod, "spec": {"containers": [{"name": "a", "image": "3"}]}}, manager="m", force=False, api_version="v1"
    )
    assert out["spec"]["containers"] == [{"name": "a", "image": "3"}, {"name": "b", "image": "2"}]


def test_field_manager_is_required() -> None:
    with pytest.raises(errors.ApiError) as exc:
        applying.apply(None, cm({}), manager="", force=False, api_version="v1")
    assert exc.value.code == 400
