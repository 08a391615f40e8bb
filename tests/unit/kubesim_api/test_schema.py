"""Structural schemas: compiled from the real agent-sandbox CRDs, then pruning, defaults, validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.apiserver import crds
from kubesim.apiserver.resources import ResourceType
from kubesim.apiserver.schema import Schema, compile_schema

_REPO = Path(__file__).resolve().parents[3]
_DIRS = (
    _REPO / "src" / "kubesim" / "controllers" / "crds",
    _REPO.parent / "shared" / "reference" / "agent-sandbox-crds",
)


def resource(filename: str) -> ResourceType:
    for d in _DIRS:
        if (d / filename).is_file():
            return crds.to_resource(yaml.safe_load((d / filename).read_text()))
    pytest.fail(f"{filename} not found in {_DIRS}")


def admit(
    rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None
) -> tuple[list[dict[str, str]], list[str]]:
    info = rt.versions["v1beta1"]
    assert info.schema is not None
    return info.schema.admit(obj, old)


def test_crd_becomes_a_resource() -> None:
    rt = resource("extensions.agents.x-k8s.io_sandboxwarmpools.yaml")
    assert (rt.group, rt.plural, rt.kind, rt.namespaced) == (
        "extensions.agents.x-k8s.io",
        "sandboxwarmpools",
        "SandboxWarmPool",
        True,
    )
    assert set(rt.versions) == {"v1beta1", "v1alpha1"}
    assert rt.storage_version == "v1beta1"
    assert rt.subresources == ("scale", "status")
    assert rt.scale == {
        "labelSelectorPath": ".status.selector",
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
    }
    assert rt.versions["v1alpha1"].deprecated


def test_defaults_and_pruning() -> None:
    rt = resource("extensions.agents.x-k8s.io_sandboxwarmpools.yaml")
    obj = {
        "apiVersion": "x",
        "kind": "SandboxWarmPool",
        "metadata": {"name": "p", "anything": 1},
        "spec": {"sandboxTemplateRef": {"name": "t", "extra": 1}, "updateStrategy": {}},
        "junk": True,
    }
    errs, pruned = admit(rt, obj)
    assert errs == []
    assert obj["spec"] == {
        "replicas": 1,
        "sandboxTemplateRef": {"name": "t"},
        "updateStrategy": {"type": "OnReplenish"},
    }
    assert sorted(pruned) == ["junk", "spec.sandboxTemplateRef.extra"]
    assert obj["metadata"] == {"name": "p", "anything": 1}  # root metadata belongs to the server


def test_required_type_enum_and_minimum_errors() -> None:
    rt = resource("extensions.agents.x-k8s.io_sandboxwarmpools.yaml")
    obj = {"spec": {"replicas": -2, "updateStrategy": {"type": "Never"}}}
    errs, _ = admit(rt, obj)
    by_field = {e["field"]: e for e in errs}
    assert by_field["spec.sandboxTemplateRef"]["reason"] == "FieldValueRequired"
    assert by_field["spec.replicas"]["message"] == (
        "Invalid value: -2: spec.replicas in body should be greater than or equal to 0"
    )
    assert by_field["spec.updateStrategy.type"]["message"] == (
        'Unsupported value: "Never": supported values: "Recreate", "OnReplenish"'
    )
    errs, _ = admit(rt, {"spec": {"replicas": "3", "sandboxTemplateRef": {"name": "t"}}})
    assert errs == [
        {
            "field": "spec.replicas",
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "string": spec.replicas in body must be of type integer: "string"',
        }
    ]


def test_claim_requires_warm_pool_ref_name() -> None:
    rt = resource("extensions.agents.x-k8s.io_sandboxclaims.yaml")
    errs, _ = admit(rt, {"spec": {"warmPoolRef": {}}})
    assert [(e["field"], e["message"]) for e in errs] == [("spec.warmPoolRef.name", "Required value")]


def test_int_or_string_and_pattern_in_pod_template() -> None:
    rt = resource("agents.x-k8s.io_sandboxes.yaml")
    container: dict[str, Any] = {"name": "c", "image": "i", "resources": {"limits": {"cpu": 1, "memory": "1Gi"}}}
    obj = {"spec": {"podTemplate": {"spec": {"containers": [container]}}}}
    errs, _ = admit(rt, obj)
    assert errs == []
    container["resources"]["limits"]["cpu"] = "lots"
    errs, _ = admit(rt, obj)
    assert [e["field"] for e in errs] == ["spec.podTemplate.spec.containers[0].resources.limits.cpu"]
    assert "should match" in errs[0]["message"]


def test_transition_rule_only_on_update() -> None:
    rt = resource("agents.x-k8s.io_sandboxes.yaml")
    base = {"spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    errs, _ = admit(rt, dict(base))
    assert errs == []
    changed = {"spec": {**base["spec"], "volumeClaimTemplates": [{"metadata": {"name": "d"}, "spec": {}}]}}
    errs, _ = admit(rt, changed, old=base)
    assert [e["message"] for e in errs] == ['Invalid value: "object": volumeClaimTemplates is immutable']


def test_nullable_and_preserve_unknown() -> None:
    schema = compile_schema(
        {
            "type": "object",
            "properties": {
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "maybe": {"type": "string", "nullable": True},
                "never": {"type": "string"},
            },
        }
    )
    obj = {"free": {"a": {"b": 1}}, "maybe": None, "never": None}
    errs, pruned = schema.admit(obj)
    assert pruned == []
    assert obj["free"] == {"a": {"b": 1}}
    assert [e["field"] for e in errs] == ["never"]


def test_list_map_keys_must_be_unique() -> None:
    rt = resource("agents.x-k8s.io_sandboxes.yaml")
    containers = [{"name": "c", "image": "i"}, {"name": "c", "image": "j"}]
    errs, _ = admit(rt, {"spec": {"podTemplate": {"spec": {"containers": containers}}}})
    assert [(e["field"], e["reason"]) for e in errs] == [("spec.podTemplate.spec.containers[1]", "FieldValueDuplicate")]


def test_ratcheting_skips_unchanged_values_at_any_depth_and_judges_changed_ones() -> None:
    schema = compile_schema(
        {
            "type": "object",
            "properties": {
                "status": {
                    "type": "object",
                    "properties": {
                        "conditions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "type": {"type": "string"},
                                    "status": {"type": "string", "enum": ["True", "False"]},
                                },
                            },
                        },
                        "note": {"type": "string", "maxLength": 3},
                    },
                }
            },
        }
    )
    old = {"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}], "note": "ok"}}
    walked: list[str] = []
    original = Schema._walk

    def spy(self: Schema, value: Any, path: str, *args: Any) -> None:
        walked.append(path)
        original(self, value, path, *args)

    new = {
        "status": {
            "conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True", "x": 1}],
            "note": "ok",
        }
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Schema, "_walk", spy)
        errs, pruned = schema.admit(new, old, old_admitted=True)
    assert errs == []
    assert pruned == ["status.conditions[1].x"]
    assert "status.conditions[1]" in walked
    assert not [p for p in walked if p.startswith(("status.conditions[0]", "status.note"))]
    # A changed value is judged; without ratcheting (another schema admitted old) everything is.
    bad = {"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "Maybe"}], "note": "ok"}}
    errs, _ = schema.admit(bad, old, old_admitted=True)
    assert [e["field"] for e in errs] == ["status.conditions[1].status"]
    long_note = {"status": {"conditions": [], "note": "toolong"}}
    errs, _ = schema.admit(long_note, {"status": {"conditions": [], "note": "toolong"}}, old_admitted=False)
    assert [e["field"] for e in errs] == ["status.note"]
