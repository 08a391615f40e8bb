"""The OpenAPI documents: what kubectl's field-validation check and `kubectl explain` read, the
v2 protobuf encoding client-go unmarshals, and the built-in pruning that strict decoding reports."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.apiserver import builtin_schemas, crds, openapi, openapi_proto
from kubesim.apiserver.resources import Registry

CRD_DIR = Path(__file__).resolve().parents[3] / "src" / "kubesim" / "controllers" / "crds"


@functools.cache  # compiling the CRDs' schemas (CEL included) is the slow part: once per module
def _registry_with_crds() -> Registry:
    registry = Registry()
    for path in sorted(CRD_DIR.glob("*.yaml")):
        registry.add(crds.to_resource(yaml.safe_load(path.read_text())))
    return registry


def _doc(docs: openapi.OpenApi, key: str) -> dict[str, Any]:
    found = docs.v3_document(key)
    assert found is not None, key
    return json.loads(found[0])


def _patch_op(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in doc["paths"].values():
        op = item.get("patch")
        if op and op["x-kubernetes-group-version-kind"]["kind"] == kind and "/status" not in op["operationId"]:
            return dict(op)
    raise AssertionError(f"no PATCH operation for {kind}")


def test_index_links_every_group_version_with_a_content_hash() -> None:
    docs = openapi.OpenApi(_registry_with_crds())
    paths = docs.v3_index()["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/agents.x-k8s.io/v1beta1", "apis/extensions.agents.x-k8s.io/v1beta1"} <= set(
        paths
    )
    url = paths["apis/apps/v1"]["serverRelativeURL"]
    found = docs.v3_document("apis/apps/v1")
    assert found is not None
    assert url == f"/openapi/v3/apis/apps/v1?hash={found[1]}"


@pytest.mark.parametrize(
    ("key", "kind"),
    [("api/v1", "Pod"), ("apis/apps/v1", "Deployment"), ("apis/extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate")],
)
def test_patch_operations_take_field_validation_and_name_their_kind(key: str, kind: str) -> None:
    op = _patch_op(_doc(openapi.OpenApi(_registry_with_crds()), key), kind)
    assert any(p["name"] == "fieldValidation" and p["in"] == "query" for p in op["parameters"])
    # No strategic merge advertised: kubectl then uses its compiled-in patch metadata.
    assert "application/strategic-merge-patch+json" not in op["requestBody"]["content"]
    assert "application/apply-patch+yaml" in op["requestBody"]["content"]


def test_crd_schema_is_published_with_metadata_and_gvk() -> None:
    doc = _doc(openapi.OpenApi(_registry_with_crds()), "apis/extensions.agents.x-k8s.io/v1beta1")
    schemas = doc["components"]["schemas"]
    tpl = schemas["io.x-k8s.agents.extensions.v1beta1.SandboxTemplate"]
    assert tpl["x-kubernetes-group-version-kind"] == [
        {"group": "extensions.agents.x-k8s.io", "version": "v1beta1", "kind": "SandboxTemplate"}
    ]
    assert tpl["properties"]["metadata"] == {"$ref": f"#/components/schemas/{openapi.OBJECT_META}"}
    assert "podTemplate" in tpl["properties"]["spec"]["properties"]
    assert openapi.OBJECT_META in schemas  # every $ref resolves inside the document
    refs = builtin_schemas.references(doc)
    assert {r for r in refs} <= set(schemas)


def test_documents_follow_the_registry() -> None:
    registry = Registry()
    docs = openapi.OpenApi(registry)
    assert "apis/agents.x-k8s.io/v1beta1" not in docs.v3_index()["paths"]
    before = docs.v3_index()["paths"]["api/v1"]["serverRelativeURL"]
    for rt in _registry_with_crds().all():
        if rt.custom:
            registry.add(rt)
    assert "apis/agents.x-k8s.io/v1beta1" in docs.v3_index()["paths"]
    assert docs.v3_index()["paths"]["api/v1"]["serverRelativeURL"] == before  # unchanged group, same hash
    registry.remove("agents.x-k8s.io", "sandboxes")
    assert "apis/agents.x-k8s.io/v1beta1" not in docs.v3_index()["paths"]


def test_every_ref_in_a_builtin_document_resolves() -> None:
    doc = _doc(openapi.OpenApi(Registry()), "api/v1")
    assert builtin_schemas.references(doc) <= set(doc["components"]["schemas"])
    pod = doc["components"]["schemas"]["io.k8s.api.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "version": "v1", "kind": "Pod"}]


def test_prune_unknown_reports_paths_like_strict_decoding() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}, "colour": "red"},
        "spec": {
            "containers": [{"name": "c", "image": "i", "bogus": 1, "resources": {"limits": {"cpu": 1}}}],
            "extra": {"x": 1},
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Mi", "medium2": "x"}}],
        },
    }
    found = builtin_schemas.prune_unknown(pod, "io.k8s.api.v1.Pod")
    assert found == ["metadata.colour", "spec.containers[0].bogus", "spec.extra", "spec.volumes[0].emptyDir.medium2"]
    assert pod["metadata"] == {"name": "p", "labels": {"a": "b"}}
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"cpu": 1}}


def test_prune_unknown_against_the_stored_object_walks_only_changed_fields() -> None:
    old = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "kept": 1}]}}
    new = {
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "kept": 1}]},  # unchanged: not walked again
        "status": {"phase": "Running", "bogus": 2},
        "junk": True,
    }
    found = builtin_schemas.prune_unknown(new, "io.k8s.api.v1.Pod", old=old)
    assert sorted(found) == ["junk", "status.bogus"]
    assert new["status"] == {"phase": "Running"}
    assert "junk" not in new
    assert new["spec"]["containers"][0]["kept"] == 1
    assert builtin_schemas.prune_unknown(new, "io.k8s.api.v1.Pod") == ["spec.containers[0].kept"]


def test_prune_unknown_against_the_stored_object_skips_unchanged_items_only() -> None:
    kept = {"name": "a", "ready": True, "kept": 1}  # as stored: never walked again while unchanged
    old = {"kind": "Pod", "status": {"phase": "Pending", "containerStatuses": [kept, {"name": "b", "ready": False}]}}
    new = {
        "kind": "Pod",
        "status": {
            "phase": "Running",
            "containerStatuses": [dict(kept), {"name": "b", "ready": True, "bogus": 1}, {"name": "c", "odd": 2}],
        },
    }
    found = builtin_schemas.prune_unknown(new, "io.k8s.api.v1.Pod", old=old)
    assert found == ["status.containerStatuses[1].bogus", "status.containerStatuses[2].odd"]
    assert new["status"]["containerStatuses"] == [kept, {"name": "b", "ready": True}, {"name": "c"}]


def test_int_or_string_fields_accept_both() -> None:
    probe = builtin_schemas.definitions()["io.k8s.api.v1.HTTPGetAction"]["properties"]["port"]
    assert probe["x-kubernetes-int-or-string"] is True


# ---- protobuf ----------------------------------------------------------------------------------


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """A minimal protobuf wire decoder: (field, wire type, int or bytes)."""
    out: list[tuple[int, int, Any]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field, wire, varint()))
        elif wire == 2:
            n = varint()
            out.append((field, wire, data[i : i + n]))
            i += n
        elif wire == 1:
            out.append((field, wire, data[i : i + 8]))
            i += 8
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def _one(data: bytes, field: int) -> Any:
    values = [v for f, _, v in _fields(data) if f == field]
    assert len(values) == 1, (field, values)
    return values[0]


def test_v2_protobuf_has_documents_paths_and_definitions() -> None:
    doc = openapi.OpenApi(_registry_with_crds()).v2_document()
    data = openapi_proto.encode(doc)
    assert _one(data, 1) == b"2.0"
    paths = [_fields(p) for f, _, p in _fields(_one(data, 8)) if f == 2]
    names = {bytes(next(v for f, _, v in p if f == 1)).decode() for p in paths}
    assert "/api/v1/namespaces/{namespace}/pods/{name}" in names
    assert "/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes/{name}" in names
    pod_item = next(
        p for p in paths if any(f == 1 and v == b"/api/v1/namespaces/{namespace}/pods/{name}" for f, _, v in p)
    )
    item = next(v for f, _, v in pod_item if f == 2)
    patch = _one(item, 8)  # PathItem.patch
    assert _one(patch, 5) == b"patchNamespacedPod"
    consumes = [v for f, _, v in _fields(patch) if f == 7]
    assert b"application/apply-patch+yaml" in consumes
    extensions = {bytes(_one(v, 1)): _one(_one(v, 2), 2) for f, _, v in _fields(patch) if f == 13}
    assert json.loads(extensions[b"x-kubernetes-group-version-kind"]) == {"group": "", "version": "v1", "kind": "Pod"}
    definitions = {bytes(_one(v, 1)).decode(): _one(v, 2) for f, _, v in _fields(_one(data, 9)) if f == 1}
    pod = definitions["io.k8s.api.v1.Pod"]
    props = {bytes(_one(v, 1)).decode() for f, _, v in _fields(_one(pod, 25)) if f == 1}
    assert props == {"apiVersion", "kind", "metadata", "spec", "status"}
    gvk = {bytes(_one(v, 1)): _one(_one(v, 2), 2) for f, _, v in _fields(pod) if f == 31}
    assert json.loads(gvk[b"x-kubernetes-group-version-kind"]) == [{"group": "", "version": "v1", "kind": "Pod"}]
