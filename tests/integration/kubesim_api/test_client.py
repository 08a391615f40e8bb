"""kubernetes_asyncio against kubesim: CRUD, watch resume, 410, preconditions, TokenReview, faults."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kubesim.apiserver import ApiServer

from .conftest import crd_dir, wait_for

GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
NS = "default"


async def install_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for path in sorted(crd_dir().glob("*.yaml")):
        await ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))


def pool(name: str, replicas: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, **meta},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "tpl"}},
    }


MERGE = "application/merge-patch+json"


async def test_custom_object_crud(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    created = await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", pool("p1"))
    assert created["metadata"]["resourceVersion"]
    assert created["spec"] == {"replicas": 1, "sandboxTemplateRef": {"name": "tpl"}}
    got = await co.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", "p1")
    assert got == created
    patched = await co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "sandboxwarmpools", "p1", {"spec": {"replicas": 2}}, _content_type=MERGE
    )
    assert patched["spec"]["replicas"] == 2
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    # A replace carrying the stale resourceVersion loses (optimistic concurrency).
    with pytest.raises(ApiException) as stale:
        await co.replace_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", "p1", created)
    assert stale.value.status == 409
    assert "the object has been modified" in stale.value.body
    # So does a merge patch that carries a resourceVersion.
    with pytest.raises(ApiException) as stale_patch:
        await co.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "sandboxwarmpools",
            "p1",
            {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "spec": {"replicas": 5}},
            _content_type=MERGE,
        )
    assert stale_patch.value.status == 409
    with pytest.raises(ApiException) as exists:
        await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", pool("p1"))
    assert exists.value.status == 409
    assert '"reason":"AlreadyExists"' in exists.value.body.replace(" ", "")
    listed = await co.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools")
    assert listed["kind"] == "SandboxWarmPoolList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["p1"]
    await co.delete_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", "p1")
    with pytest.raises(ApiException) as gone:
        await co.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", "p1")
    assert gone.value.status == 404


async def test_generate_name_and_no_op_writes(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    body = {"metadata": {"generateName": "cfg-"}, "data": {"a": "1"}}
    created = await core.create_namespaced_config_map(NS, body)
    name = created.metadata.name
    assert name.startswith("cfg-")
    assert len(name) == len("cfg-") + 5
    same = await core.patch_namespaced_config_map(name, NS, {"data": {"a": "1"}})
    assert same.metadata.resource_version == created.metadata.resource_version


async def test_watch_resumes_from_resource_version(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", pool("w1"))
    listed = await co.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools")
    list_rv = listed["metadata"]["resourceVersion"]
    versions = []
    for replicas in (2, 3):
        out = await co.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "sandboxwarmpools", "w1", {"spec": {"replicas": replicas}}, _content_type=MERGE
        )
        versions.append(out["metadata"]["resourceVersion"])
    seen: list[tuple[str, int]] = []
    w = watch.Watch()
    async with w.stream(
        co.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        "sandboxwarmpools",
        resource_version=list_rv,
        timeout_seconds=5,
    ) as stream:
        async for event in stream:
            seen.append((event["type"], event["object"]["spec"]["replicas"]))
            if len(seen) == 2:
                w.stop()
    assert seen == [("MODIFIED", 2), ("MODIFIED", 3)]
    # Resuming from the first change replays only what came after it.
    seen.clear()
    w = watch.Watch()
    async with w.stream(
        co.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        "sandboxwarmpools",
        resource_version=versions[0],
        timeout_seconds=5,
    ) as stream:
        async for event in stream:
            seen.append((event["type"], event["object"]["spec"]["replicas"]))
            w.stop()
    assert seen == [("MODIFIED", 3)]


async def test_watch_from_compacted_version_gets_410(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    first = await core.create_namespaced_config_map(NS, {"metadata": {"name": "a"}})
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "b"}})
    server.compact()
    w = watch.Watch()

    async def drain() -> None:
        async with w.stream(
            core.list_namespaced_config_map, NS, resource_version=first.metadata.resource_version, timeout_seconds=5
        ) as stream:
            async for _ in stream:
                pass

    with pytest.raises(ApiException) as expired:
        await drain()
    assert expired.value.status == 410
    # A list continuing from before the compaction is a plain HTTP 410.
    page = await core.list_namespaced_config_map(NS, limit=1)
    assert page.metadata._continue
    assert page.metadata.remaining_item_count == 1
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "c"}})
    server.compact()
    with pytest.raises(ApiException) as too_old:
        await core.list_namespaced_config_map(NS, limit=1, _continue=page.metadata._continue)
    assert too_old.value.status == 410


async def test_list_pagination(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for i in range(5):
        await core.create_namespaced_config_map(NS, {"metadata": {"name": f"page-{i}"}})
    names: list[str] = []
    token = None
    while True:
        page = await core.list_namespaced_config_map(NS, limit=2, _continue=token)
        names += [i.metadata.name for i in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == [f"page-{i}" for i in range(5)]
    # Later pages are served from the first page's snapshot, as etcd-backed lists are.
    first = await core.list_namespaced_config_map(NS, limit=2)
    await core.delete_namespaced_config_map("page-3", NS)
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "page-9"}})
    rest = await core.list_namespaced_config_map(NS, limit=10, _continue=first.metadata._continue)
    assert [i.metadata.name for i in rest.items] == ["page-2", "page-3", "page-4"]
    assert rest.metadata.resource_version == first.metadata.resource_version


async def test_watch_label_selector_turns_changes_into_added_and_deleted(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    cm = await core.create_namespaced_config_map(NS, {"metadata": {"name": "sel", "labels": {"app": "x"}}})
    rv = cm.metadata.resource_version
    await core.patch_namespaced_config_map("sel", NS, {"metadata": {"labels": {"app": "y"}}})
    await core.patch_namespaced_config_map("sel", NS, {"metadata": {"labels": {"app": "x"}}})
    seen = []
    w = watch.Watch()
    async with w.stream(
        core.list_namespaced_config_map, NS, label_selector="app=x", resource_version=rv, timeout_seconds=5
    ) as stream:
        async for event in stream:
            seen.append(event["type"])
            if len(seen) == 2:
                w.stop()
    assert seen == ["DELETED", "ADDED"]


async def test_bookmarks_and_initial_events(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "bm"}})
    seen = []
    w = watch.Watch()
    async with w.stream(core.list_namespaced_config_map, NS, allow_watch_bookmarks=True, timeout_seconds=5) as stream:
        async for event in stream:
            seen.append(event["type"])
            if event["type"] == "BOOKMARK":
                w.stop()
    assert seen[0] == "ADDED"  # a watch without resourceVersion starts with the current state
    assert seen[-1] == "BOOKMARK"


async def test_delete_preconditions(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    cm = await core.create_namespaced_config_map(NS, {"metadata": {"name": "pre"}})
    await core.patch_namespaced_config_map("pre", NS, {"data": {"k": "v"}})
    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=cm.metadata.resource_version))
    with pytest.raises(ApiException) as conflict:
        await core.delete_namespaced_config_map("pre", NS, body=stale)
    assert conflict.value.status == 409
    assert "Precondition failed: ResourceVersion in precondition" in conflict.value.body
    wrong_uid = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
    with pytest.raises(ApiException) as uid_conflict:
        await core.delete_namespaced_config_map("pre", NS, body=wrong_uid)
    assert uid_conflict.value.status == 409
    right = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=cm.metadata.uid))
    await core.delete_namespaced_config_map("pre", NS, body=right)
    assert (await core.list_namespaced_config_map(NS, field_selector="metadata.name=pre")).items == []


async def _pod(core: client.CoreV1Api, name: str) -> client.V1Pod:
    body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}
    return await core.create_namespaced_pod(NS, body)


async def _token(core: client.CoreV1Api, pod: client.V1Pod, audience: str) -> str:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid},
        },
    }
    out = await core.create_namespaced_service_account_token("default", NS, request)
    return str(out.status.token)


async def _review(auth: client.AuthenticationV1Api, token: str, audience: str) -> Any:
    body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[audience]))
    return (await auth.create_token_review(body)).status


async def test_token_review_of_pod_bound_token(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    auth = client.AuthenticationV1Api(api)
    pod = await _pod(core, "bound")
    token = await _token(core, pod, "warmshell-gateway")
    status = await _review(auth, token, "warmshell-gateway")
    assert status.authenticated is True
    assert status.user.username == "system:serviceaccount:default:default"
    assert status.user.extra["authentication.kubernetes.io/pod-name"] == ["bound"]
    assert status.user.extra["authentication.kubernetes.io/pod-uid"] == [pod.metadata.uid]
    assert status.audiences == ["warmshell-gateway"]
    wrong = await _review(auth, token, "someone-else")
    assert not wrong.authenticated
    assert "audiences" in wrong.error
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert not (await _review(auth, forged, "warmshell-gateway")).authenticated
    # Expired: move the issuer's clock past expirationSeconds.
    real_clock = server.issuer.clock
    server.issuer.clock = lambda: real_clock() + 601
    try:
        expired = await _review(auth, token, "warmshell-gateway")
    finally:
        server.issuer.clock = real_clock
    assert not expired.authenticated
    assert "expired" in expired.error
    # The bound pod goes away: the token stops working.
    await core.delete_namespaced_pod("bound", NS)
    gone = await _review(auth, token, "warmshell-gateway")
    assert not gone.authenticated
    assert "pod" in gone.error
    # A new pod with the same name has another uid; the old token stays dead.
    await _pod(core, "bound")
    assert not (await _review(auth, token, "warmshell-gateway")).authenticated


async def test_token_request_rejects_a_stale_pod_uid(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    pod = await _pod(core, "p")
    pod.metadata.uid = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(ApiException) as stale:
        await _token(core, pod, "aud")
    assert stale.value.status == 409


async def test_injected_faults(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    server.faults.fail_next(1, code=429, verb="create", resource="configmaps", retry_after=3)
    with pytest.raises(ApiException) as throttled:
        await core.create_namespaced_config_map(NS, {"metadata": {"name": "f"}})
    assert throttled.value.status == 429
    assert throttled.value.headers["Retry-After"] == "3"
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "f"}})  # only the next one failed
    server.faults.fail_next(2, code=500, user="someone-else")
    await core.read_namespaced_config_map("f", NS)  # rules can target a user; we are not them
    server.faults.clear()
    server.faults.make_unavailable(30)
    with pytest.raises(ApiException) as down:
        await core.read_namespaced_config_map("f", NS)
    assert down.value.status == 503
    server.faults.clear()
    server.faults.add_latency(0.2, verb="get")
    start = time.perf_counter()
    await core.read_namespaced_config_map("f", NS)
    assert time.perf_counter() - start >= 0.2


async def test_request_log_counts_by_user(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    server.log.clear()
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "counted"}})
    await core.read_namespaced_config_map("counted", NS)
    assert server.log.count(user="kubesim-user", verb="create", resource="configmaps") == 1
    assert server.log.count(user="kubesim-user", verb="get") == 1
    assert server.log.count(user="kubesim-admin") == 0


async def test_garbage_collection_policies(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)

    async def owned(owner: client.V1ConfigMap, name: str) -> None:
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        await core.create_namespaced_config_map(NS, {"metadata": {"name": name, "ownerReferences": [ref]}})

    def exists(name: str) -> bool:
        return server.store.get("", "configmaps", NS, name) is not None

    bg = await core.create_namespaced_config_map(NS, {"metadata": {"name": "bg"}})
    await owned(bg, "bg-child")
    await core.delete_namespaced_config_map("bg", NS)
    await wait_for(lambda: not exists("bg-child"))

    fg = await core.create_namespaced_config_map(NS, {"metadata": {"name": "fg"}})
    await owned(fg, "fg-child")
    await core.patch_namespaced_config_map("fg-child", NS, {"metadata": {"finalizers": ["hold"]}})
    await core.delete_namespaced_config_map("fg", NS, propagation_policy="Foreground")
    await wait_for(
        lambda: (
            exists("fg-child")
            and bool(server.store.get("", "configmaps", NS, "fg-child").obj["metadata"].get("deletionTimestamp"))
        )
    )
    owner = server.store.get("", "configmaps", NS, "fg")
    assert owner is not None
    assert "foregroundDeletion" in owner.obj["metadata"]["finalizers"]
    await core.patch_namespaced_config_map("fg-child", NS, {"metadata": {"finalizers": None}})
    await wait_for(lambda: not exists("fg") and not exists("fg-child"))

    orphan = await core.create_namespaced_config_map(NS, {"metadata": {"name": "or"}})
    await owned(orphan, "or-child")
    await core.delete_namespaced_config_map("or", NS, propagation_policy="Orphan")
    await wait_for(lambda: not exists("or"))
    child = await core.read_namespaced_config_map("or-child", NS)
    assert not child.metadata.owner_references


async def test_namespace_deletion_empties_it(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": "scratch"}})
    await wait_for(lambda: server.store.get("", "serviceaccounts", "scratch", "default") is not None)
    await core.create_namespaced_config_map("scratch", {"metadata": {"name": "x"}})
    await core.delete_namespace("scratch")
    await wait_for(lambda: server.store.get("", "namespaces", "", "scratch") is None)
    assert server.store.get("", "configmaps", "scratch", "x") is None
    with pytest.raises(ApiException) as missing:
        await core.create_namespaced_config_map("scratch", {"metadata": {"name": "y"}})
    assert missing.value.status == 404


async def test_pods_are_deleted_gracefully_once_scheduled(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    pod = await _pod(core, "graceful")
    assert pod.status.phase == "Pending"
    assert pod.spec.service_account_name == "default"
    # A real server answers a Binding with a Status, which the generated client cannot load into
    # V1Binding (a known client bug), so read the raw answer.
    resp = await core.create_namespaced_pod_binding(
        "graceful",
        NS,
        {"metadata": {"name": "graceful"}, "target": {"kind": "Node", "name": "node-1"}},
        _preload_content=False,
    )
    assert resp.status == 201
    resp.release()
    await core.delete_namespaced_pod("graceful", NS)
    still = await core.read_namespaced_pod("graceful", NS)
    assert still.metadata.deletion_timestamp is not None
    assert still.spec.node_name == "node-1"
    # What a kubelet does once containers have stopped.
    await core.delete_namespaced_pod("graceful", NS, grace_period_seconds=0)
    assert server.store.get("", "pods", NS, "graceful") is None


async def test_schema_defaults_pruning_and_strict_validation(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    body = pool("schema")
    body["spec"]["updateStrategy"] = {}
    body["spec"]["surprise"] = True
    created = await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", body)
    assert created["spec"]["updateStrategy"] == {"type": "OnReplenish"}
    assert "surprise" not in created["spec"]
    body = pool("strict")
    body["spec"]["surprise"] = True
    with pytest.raises(ApiException) as strict:
        await co.create_namespaced_custom_object(
            GROUP, VERSION, NS, "sandboxwarmpools", body, field_validation="Strict"
        )
    assert strict.value.status == 400
    assert 'unknown field "spec.surprise"' in json.loads(strict.value.body)["message"]


async def test_sandbox_volume_claim_templates_are_immutable(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    sandbox = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    await co.create_namespaced_custom_object("agents.x-k8s.io", "v1beta1", NS, "sandboxes", sandbox)
    with pytest.raises(ApiException) as immutable:
        await co.patch_namespaced_custom_object(
            "agents.x-k8s.io",
            "v1beta1",
            NS,
            "sandboxes",
            "sb",
            {"spec": {"volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]}},
            _content_type=MERGE,
        )
    assert immutable.value.status == 422
    assert "volumeClaimTemplates is immutable" in immutable.value.body


async def test_scale_subresource(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", pool("sc"))
    scale = await co.get_namespaced_custom_object_scale(GROUP, VERSION, NS, "sandboxwarmpools", "sc")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 1
    await co.patch_namespaced_custom_object_scale(
        GROUP, VERSION, NS, "sandboxwarmpools", "sc", {"spec": {"replicas": 4}}, _content_type=MERGE
    )
    got = await co.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", "sc")
    assert got["spec"]["replicas"] == 4


async def test_server_side_apply_of_custom_objects(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    apply = "application/apply-patch+yaml"
    body = pool("ssa", replicas=2)
    first = await co.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxwarmpools",
        "ssa",
        body,
        field_manager="warmshell",
        force=True,
        _content_type=apply,
    )
    # An apply that creates answers 201 like a real server; kubernetes_asyncio's patch maps only 200,
    # so it returns None here and callers must read the object back.
    assert first is None
    created = await co.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", "ssa")
    assert created["spec"]["replicas"] == 2
    body["spec"]["replicas"] = 3
    body["metadata"]["labels"] = {"fingerprint": "abc"}
    second = await co.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxwarmpools",
        "ssa",
        body,
        field_manager="warmshell",
        force=True,
        _content_type=apply,
    )
    assert second["spec"]["replicas"] == 3
    assert second["metadata"]["labels"] == {"fingerprint": "abc"}
    assert second["metadata"]["generation"] == 2
    assert [m["manager"] for m in second["metadata"]["managedFields"]] == ["warmshell"]
    # Another manager applying a different value for an owned field conflicts unless forced.
    with pytest.raises(ApiException) as conflict:
        await co.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "sandboxwarmpools",
            "ssa",
            pool("ssa", replicas=9),
            field_manager="other",
            _content_type=apply,
        )
    assert conflict.value.status == 409


async def test_deleting_a_crd_removes_its_objects_and_resource(api: client.ApiClient, server: ApiServer) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", pool("doomed"))
    await client.ApiextensionsV1Api(api).delete_custom_resource_definition(f"sandboxwarmpools.{GROUP}")
    assert server.store.get(GROUP, "sandboxwarmpools", NS, "doomed") is None
    with pytest.raises(ApiException) as missing:
        await co.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools")
    assert missing.value.status == 404


async def test_deprecated_version_is_served_with_a_warning(api: client.ApiClient) -> None:
    await install_crds(api)
    co = client.CustomObjectsApi(api)
    await co.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxwarmpools", pool("old"))
    raw = await co.get_namespaced_custom_object(
        GROUP, "v1alpha1", NS, "sandboxwarmpools", "old", _preload_content=False
    )
    body = json.loads(await raw.read())
    assert body["apiVersion"] == f"{GROUP}/v1alpha1"
    # Writes at a deprecated version carry the CRD's deprecation warning.
    resp = await co.patch_namespaced_custom_object(
        GROUP,
        "v1alpha1",
        NS,
        "sandboxwarmpools",
        "old",
        {"spec": {"replicas": 2}},
        _content_type=MERGE,
        _preload_content=False,
    )
    assert "is deprecated" in resp.headers.get("Warning", "")
    resp.release()


async def test_pod_status_strategic_merge_by_condition_type(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await _pod(core, "status")
    ready = {"type": "Ready", "status": "False"}
    scheduled = {"type": "PodScheduled", "status": "True"}
    await core.patch_namespaced_pod_status(
        "status", NS, {"status": {"phase": "Running", "conditions": [scheduled, ready]}}
    )
    # kubernetes_asyncio sends a dict patch to core kinds as a strategic merge patch.
    pod = await core.patch_namespaced_pod_status(
        "status", NS, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True"), ("Ready", "True")]
    assert pod.status.phase == "Running"
    assert pod.metadata.generation == 1
