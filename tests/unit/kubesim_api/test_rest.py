"""The write path without HTTP: generation, status split, no-ops, finalizers, CRD registration."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubesim.apiserver import builtin_schemas, deletion, errors, meta, special
from kubesim.apiserver.resources import Registry, ResourceType
from kubesim.apiserver.rest import MERGE, Rest, WriteOptions
from kubesim.apiserver.schema import Schema
from kubesim.apiserver.store import Store
from kubesim.jsonwire import dumps

OPTS = WriteOptions()


def crd(pattern: str = "^[a-z]+$") -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"size": {"type": "integer"}, "word": {"type": "string", "pattern": pattern}},
            },
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


@pytest.fixture
def rest() -> Rest:
    r = Rest(Store(), Registry())
    ns_rt = r.registry.get("", "namespaces")
    assert ns_rt is not None
    r.create(ns_rt, "v1", "", {"metadata": {"name": "default"}}, OPTS)
    return r


def widgets(rest: Rest) -> ResourceType:
    crd_rt = rest.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
    assert crd_rt is not None
    created = rest.create(crd_rt, "v1", "", crd(), OPTS)
    assert created.code == 201
    assert {c["type"] for c in created.obj["status"]["conditions"]} == {"NamesAccepted", "Established"}
    rt = rest.registry.get("example.com", "widgets")
    assert rt is not None
    return rt


def test_generation_status_and_no_op(rest: Rest) -> None:
    rt = widgets(rest)
    obj = rest.create(
        rt, "v1", "default", {"metadata": {"name": "w"}, "spec": {"size": 1}, "status": {"ready": True}}, OPTS
    ).obj
    assert "status" not in obj  # dropped on create when status is a subresource
    assert obj["metadata"]["generation"] == 1
    status = copy.deepcopy(obj)
    status["status"] = {"ready": True}
    after_status = rest.update(rt, "v1", "default", "w", status, OPTS, subresource="status").obj
    assert after_status["status"] == {"ready": True}
    assert after_status["metadata"]["generation"] == 1
    spec = copy.deepcopy(after_status)
    spec["spec"]["size"] = 2
    after_spec = rest.update(rt, "v1", "default", "w", spec, OPTS).obj
    assert after_spec["metadata"]["generation"] == 2
    assert after_spec["status"] == {"ready": True}  # the main resource cannot change status
    same = rest.update(rt, "v1", "default", "w", copy.deepcopy(after_spec), OPTS).obj
    assert same["metadata"]["resourceVersion"] == after_spec["metadata"]["resourceVersion"]


def test_update_of_a_custom_resource_needs_a_resource_version(rest: Rest) -> None:
    rt = widgets(rest)
    rest.create(rt, "v1", "default", {"metadata": {"name": "w"}, "spec": {}}, OPTS)
    with pytest.raises(errors.ApiError) as exc:
        rest.update(rt, "v1", "default", "w", {"metadata": {"name": "w"}, "spec": {"size": 3}}, OPTS)
    assert exc.value.code == 422
    assert "must be specified for an update" in exc.value.message


def test_finalizers_hold_deletion(rest: Rest) -> None:
    rt = widgets(rest)
    rest.create(rt, "v1", "default", {"metadata": {"name": "w", "finalizers": ["x/y"]}, "spec": {}}, OPTS)
    result = deletion.delete(rest, rt, "v1", "default", "w", deletion.DeleteOptions())
    assert result.obj["metadata"]["deletionTimestamp"]
    held = copy.deepcopy(rest.get(rt, "default", "w").obj)
    held["metadata"]["finalizers"].append("new/one")
    with pytest.raises(errors.ApiError) as exc:
        rest.update(rt, "v1", "default", "w", held, OPTS)
    assert exc.value.code == 422
    held["metadata"]["finalizers"] = []
    rest.update(rt, "v1", "default", "w", held, OPTS)
    assert rest.store.get("example.com", "widgets", "default", "w") is None


def test_crd_with_an_unusable_schema_is_rejected(rest: Rest) -> None:
    crd_rt = rest.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
    assert crd_rt is not None
    with pytest.raises(errors.ApiError) as exc:
        rest.create(crd_rt, "v1", "", crd(pattern="(unclosed"), OPTS)
    assert exc.value.code == 422
    assert rest.registry.get("example.com", "widgets") is None


def test_dns_names_and_labels_are_validated(rest: Rest) -> None:
    cm = rest.registry.get("", "configmaps")
    assert cm is not None
    with pytest.raises(errors.ApiError) as bad_name:
        rest.create(cm, "v1", "default", {"metadata": {"name": "Not_Valid"}}, OPTS)
    assert bad_name.value.code == 422
    with pytest.raises(errors.ApiError) as bad_label:
        rest.create(cm, "v1", "default", {"metadata": {"name": "ok", "labels": {"a": "has space"}}}, OPTS)
    assert bad_label.value.code == 422
    with pytest.raises(errors.ApiError) as no_ns:
        rest.create(cm, "v1", "missing", {"metadata": {"name": "ok"}}, OPTS)
    assert no_ns.value.code == 404


def _walked_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the schema walk visits from now on, in order."""
    walked: list[str] = []
    original = Schema._walk

    def spy(self: Schema, value: Any, path: str, *args: Any) -> None:
        walked.append(path)
        original(self, value, path, *args)

    monkeypatch.setattr(Schema, "_walk", spy)
    return walked


def test_a_status_write_does_not_walk_an_unchanged_spec_but_a_new_schema_does(
    rest: Rest, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = widgets(rest)
    created = rest.create(rt, "v1", "default", {"metadata": {"name": "w"}, "spec": {"word": "abc"}}, OPTS).obj
    walked = _walked_paths(monkeypatch)
    status = {**copy.deepcopy(created), "status": {"ready": True}}
    rest.update(rt, "v1", "default", "w", status, OPTS, subresource="status")
    assert "status" in walked
    assert not any(p.startswith("spec") for p in walked)
    # A changed field is still judged.
    current = rest.get(rt, "default", "w").obj
    with pytest.raises(errors.ApiError) as exc:
        rest.update(rt, "v1", "default", "w", {**copy.deepcopy(current), "spec": {"word": "ABC"}}, OPTS)
    assert exc.value.code == 422
    # Under a new schema the unchanged spec is walked again, and now fails it.
    crd_rt = rest.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
    assert crd_rt is not None
    live_crd = copy.deepcopy(rest.get(crd_rt, "", "widgets.example.com").obj)
    live_crd["spec"] = crd(pattern="^[0-9]+$")["spec"]
    rest.update(crd_rt, "v1", "", "widgets.example.com", live_crd, OPTS)
    rt = rest.registry.get("example.com", "widgets")
    assert rt is not None
    walked.clear()
    status = {**copy.deepcopy(rest.get(rt, "default", "w").obj), "status": {"ready": False}}
    with pytest.raises(errors.ApiError) as exc:
        rest.update(rt, "v1", "default", "w", status, OPTS, subresource="status")
    assert exc.value.code == 422
    assert "spec.word" in walked


def test_a_create_with_the_spec_of_the_last_clean_create_is_not_walked_again(
    rest: Rest, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = widgets(rest)
    walked = _walked_paths(monkeypatch)
    rest.create(rt, "v1", "default", {"metadata": {"name": "a"}, "spec": {"word": "abc"}}, OPTS)
    assert "spec.word" in walked
    walked.clear()
    second = rest.create(rt, "v1", "default", {"metadata": {"name": "b"}, "spec": {"word": "abc"}}, OPTS)
    assert second.obj["spec"] == {"word": "abc"}
    assert not any(p.startswith("spec") for p in walked)
    # Any other spec is judged: a bad value is refused, an unknown field pruned and walked again next time.
    with pytest.raises(errors.ApiError) as exc:
        rest.create(rt, "v1", "default", {"metadata": {"name": "c"}, "spec": {"word": "ABC"}}, OPTS)
    assert exc.value.code == 422
    for name in ("d", "e"):
        walked.clear()
        pruned = rest.create(rt, "v1", "default", {"metadata": {"name": name}, "spec": {"word": "x", "odd": 1}}, OPTS)
        assert pruned.obj["spec"] == {"word": "x"}
        assert pruned.warnings == ['unknown field "spec.odd"']
        assert "spec.word" in walked


def test_a_remembered_spec_is_walked_again_under_a_new_schema(rest: Rest) -> None:
    rt = widgets(rest)
    rest.create(rt, "v1", "default", {"metadata": {"name": "a"}, "spec": {"word": "abc"}}, OPTS)
    crd_rt = rest.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
    assert crd_rt is not None
    live_crd = copy.deepcopy(rest.get(crd_rt, "", "widgets.example.com").obj)
    live_crd["spec"] = crd(pattern="^[0-9]+$")["spec"]
    rest.update(crd_rt, "v1", "", "widgets.example.com", live_crd, OPTS)
    rt = rest.registry.get("example.com", "widgets")
    assert rt is not None
    with pytest.raises(errors.ApiError) as exc:
        rest.create(rt, "v1", "default", {"metadata": {"name": "c"}, "spec": {"word": "abc"}}, OPTS)
    assert exc.value.code == 422


def test_a_pod_with_the_spec_of_the_last_clean_pod_still_loses_unknown_fields_elsewhere(rest: Rest) -> None:
    pods = rest.registry.get("", "pods")
    assert pods is not None
    spec = {"containers": [{"name": "c", "image": "busybox"}]}
    rest.create(pods, "v1", "default", {"metadata": {"name": "a"}, "spec": copy.deepcopy(spec)}, OPTS)
    second = rest.create(
        pods, "v1", "default", {"metadata": {"name": "b"}, "spec": copy.deepcopy(spec), "odd": 1}, OPTS
    )
    assert "odd" not in second.obj
    assert second.warnings == ['unknown field "odd"']
    odd_spec = {"containers": [{"name": "c", "image": "busybox", "odd": 1}]}
    third = rest.create(pods, "v1", "default", {"metadata": {"name": "c"}, "spec": odd_spec}, OPTS)
    assert "odd" not in third.obj["spec"]["containers"][0]


def _with_detail(detail_props: dict[str, Any]) -> dict[str, Any]:
    """The widgets CRD with an object ``status.detail`` of these properties."""
    body = crd()
    schema = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["status"]["properties"]["detail"] = {"type": "object", "properties": detail_props}
    return body


def test_a_status_merge_patch_leaves_every_earlier_version_as_it_was_under_any_schema(rest: Rest) -> None:
    crd_rt = rest.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
    assert crd_rt is not None
    rest.create(crd_rt, "v1", "", _with_detail({"a": {"type": "integer"}}), OPTS)
    rt = rest.registry.get("example.com", "widgets")
    assert rt is not None
    rest.create(rt, "v1", "default", {"metadata": {"name": "w"}, "spec": {"size": 1}}, OPTS)
    versions = []

    def status_patch(status: dict[str, Any]) -> dict[str, Any]:
        written = rest.patch_decoded(rt, "v1", "default", "w", MERGE, {"status": status}, OPTS, "status")
        assert written.stored is not None
        versions.append((written.stored, dumps(written.stored.obj)))
        return written.obj

    status_patch({"ready": True, "detail": {"a": 1}})
    second = status_patch({"ready": False})  # "detail" unchanged: the stored one's own dict
    assert second["status"] == {"ready": False, "detail": {"a": 1}}
    # A new schema defaults a field inside the unchanged "detail": that walk must not reach into
    # the earlier version's dict.
    live = copy.deepcopy(rest.get(crd_rt, "", "widgets.example.com").obj)
    live["spec"] = _with_detail({"a": {"type": "integer"}, "b": {"type": "string", "default": "x"}})["spec"]
    rest.update(crd_rt, "v1", "", "widgets.example.com", live, OPTS)
    rt = rest.registry.get("example.com", "widgets")
    assert rt is not None
    third = status_patch({"ready": True})
    assert third["status"]["detail"] == {"a": 1, "b": "x"}
    assert third["spec"] == {"size": 1}
    for stored, encoded in versions:
        assert dumps(stored.obj) == encoded


def _defaulting_widgets(rest: Rest) -> ResourceType:
    """The widgets CRD whose spec gets ``mode: Running`` when it has none (as a Sandbox's
    ``operatingMode``)."""
    body = crd()
    spec = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["mode"] = {"type": "string", "default": "Running", "enum": ["Running", "Suspended"]}
    crd_rt = rest.registry.get("apiextensions.k8s.io", "customresourcedefinitions")
    assert crd_rt is not None
    rest.create(crd_rt, "v1", "", body, OPTS)
    rt = rest.registry.get("example.com", "widgets")
    assert rt is not None
    return rt


def test_a_create_with_the_spec_of_the_last_defaulted_create_gets_the_defaults_without_a_walk(
    rest: Rest, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = _defaulting_widgets(rest)
    walked = _walked_paths(monkeypatch)
    first = rest.create(rt, "v1", "default", {"metadata": {"name": "a"}, "spec": {"word": "abc"}}, OPTS)
    assert first.obj["spec"] == {"word": "abc", "mode": "Running"}
    assert "spec.mode" in walked
    walked.clear()
    second = rest.create(rt, "v1", "default", {"metadata": {"name": "b"}, "spec": {"word": "abc"}}, OPTS)
    assert second.obj["spec"] == {"word": "abc", "mode": "Running"}
    assert second.warnings == []
    assert not any(p.startswith("spec") for p in walked)
    # Each object owns its spec: the remembered one is not shared between them.
    stored = [rest.get(rt, "default", n).obj["spec"] for n in ("a", "b")]
    assert stored[0] is not stored[1]
    # A spec that differs is walked: its own default, its own bad value.
    third = rest.create(rt, "v1", "default", {"metadata": {"name": "c"}, "spec": {"mode": "Suspended"}}, OPTS)
    assert third.obj["spec"] == {"mode": "Suspended"}
    with pytest.raises(errors.ApiError) as exc:
        rest.create(rt, "v1", "default", {"metadata": {"name": "d"}, "spec": {"word": "abc", "mode": "Off"}}, OPTS)
    assert exc.value.code == 422


def test_a_spec_that_lost_an_unknown_field_is_not_remembered(rest: Rest) -> None:
    rt = _defaulting_widgets(rest)
    for name in ("a", "b"):
        body = {"metadata": {"name": name}, "spec": {"word": "abc", "odd": 1}}
        pruned = rest.create(rt, "v1", "default", body, OPTS)
        assert pruned.obj["spec"] == {"word": "abc", "mode": "Running"}
        assert pruned.warnings == ['unknown field "spec.odd"'], "the second create's warning went missing"


def _pruning_walk(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths a built-in kind's pruning walk visits from now on."""
    walked: list[str] = []
    original = builtin_schemas._walk

    def spy(value: Any, schema: dict[str, Any], path: str, *args: Any) -> None:
        walked.append(path)
        original(value, schema, path, *args)

    monkeypatch.setattr(builtin_schemas, "_walk", spy)
    return walked


def _status_write(rest: Rest, pods: ResourceType, status: dict[str, Any]) -> dict[str, Any]:
    current = copy.deepcopy(rest.get(pods, "default", "p").obj)
    return rest.update(pods, "v1", "default", "p", {**current, "status": status}, OPTS, subresource="status").obj


def test_a_bound_or_terminating_pod_is_not_walked_whole_by_its_next_status_write(
    rest: Rest, monkeypatch: pytest.MonkeyPatch
) -> None:
    pods = rest.registry.get("", "pods")
    assert pods is not None
    spec = {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "1"}]}]}
    rest.create(pods, "v1", "default", {"metadata": {"name": "p"}, "spec": spec}, OPTS)
    special.bind(rest, "default", "p", {"target": {"name": "node-1"}})
    walked = _pruning_walk(monkeypatch)
    written = _status_write(rest, pods, {"phase": "Running", "odd": 1})
    assert written["spec"]["nodeName"] == "node-1"
    assert "odd" not in written["status"], "a changed status is still pruned"
    assert walked
    assert not any(p.startswith("spec") for p in walked)
    deletion.delete(rest, pods, "v1", "default", "p", deletion.DeleteOptions())
    walked.clear()
    written = _status_write(rest, pods, {"phase": "Running", "message": "stopping", "odd": 2})
    assert written["metadata"]["deletionTimestamp"]
    assert "odd" not in written["status"]
    assert walked
    assert not any(p.startswith("spec") for p in walked)


def test_labels_and_annotations_a_write_leaves_as_they_were_are_not_checked_again(
    rest: Rest, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = widgets(rest)
    labelled = {"name": "w", "labels": {"app": "x"}, "annotations": {"note": "y"}}
    rest.create(rt, "v1", "default", {"metadata": labelled, "spec": {"word": "abc"}}, OPTS)
    checked: list[str] = []
    original = meta._key_errors

    def spy(key: str) -> list[str]:
        checked.append(key)
        return original(key)

    monkeypatch.setattr(meta, "_key_errors", spy)
    current = copy.deepcopy(rest.get(rt, "default", "w").obj)
    rest.update(rt, "v1", "default", "w", {**current, "status": {"ready": True}}, OPTS, subresource="status")
    assert checked == []
    current = copy.deepcopy(rest.get(rt, "default", "w").obj)
    current["metadata"]["labels"]["bad key!"] = "v"
    with pytest.raises(errors.ApiError) as exc:
        rest.update(rt, "v1", "default", "w", current, OPTS)
    assert exc.value.code == 422
    assert "bad key!" in checked
    assert "note" not in checked
