"""A pod's spec is immutable but for a few fields: whatever else an update changes is refused,
and a write that leaves the spec as it was (the kubelet's status, labels) is never refused."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kubesim.apiserver.builtins import validate_pod


def pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "containers": [{"name": "main", "image": "a:1", "command": ["sleep", "1"]}],
        "terminationGracePeriodSeconds": 30,
        "tolerations": [],
    }
    return {"metadata": {"name": "p"}, "spec": {**base, **spec}, "status": {"phase": "Pending"}}


def forbidden(errors: list[Any]) -> bool:
    return any(e["reason"] == "FieldValueForbidden" and e["field"] == "spec" for e in errors)


def test_an_update_that_leaves_the_spec_alone_is_allowed() -> None:
    old = pod()
    new = copy.deepcopy(old)
    new["status"] = {"phase": "Running"}
    new["metadata"]["labels"] = {"x": "y"}
    assert validate_pod(new, old) == []


def test_the_mutable_fields_and_container_images_may_change() -> None:
    old = pod()
    new = pod(terminationGracePeriodSeconds=1, activeDeadlineSeconds=5, tolerations=[{"key": "k"}])
    new["spec"]["containers"][0]["image"] = "a:2"
    assert validate_pod(new, old) == []


def test_any_other_spec_change_is_refused_and_the_old_spec_is_untouched() -> None:
    old = pod()
    kept = copy.deepcopy(old)
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["command"] = ["sleep", "2"]
    assert forbidden(validate_pod(new, old))
    assert old == kept  # comparing masks copies nothing it then edits in the stored object
    assert forbidden(validate_pod(pod(nodeName="elsewhere"), old))


@given(st.sampled_from(["command", "args", "workingDir", "name"]), st.text(min_size=1, max_size=5))
def test_a_changed_container_field_other_than_the_image_is_refused(field: str, value: str) -> None:
    old = pod()
    new = copy.deepcopy(old)
    before = new["spec"]["containers"][0].get(field)
    new["spec"]["containers"][0][field] = [value] if isinstance(before, list) else value
    changed = new["spec"]["containers"][0][field] != before
    assert forbidden(validate_pod(new, old)) == changed
