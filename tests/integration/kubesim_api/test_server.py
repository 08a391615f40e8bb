"""Discovery documents, dry runs, watch ends, the admin endpoints and the ``kubesim serve`` CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, watch

from kubesim.apiserver import ApiServer, ServerConfig
from kubesim.apiserver.auth import Attributes
from kubesim.testing import running_apiserver

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"


async def get(
    server: ApiServer,
    path: str,
    *,
    token: str | None = None,
    accept: str = "application/json",
    method: str = "GET",
    body: Any = None,
) -> tuple[int, dict[str, str], Any]:
    assert server.certificates is not None
    ctx = server.certificates.client_context()
    headers = {"Accept": accept, "Authorization": f"Bearer {token or server.user_token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, server.url + path, headers=headers, ssl=ctx, json=body) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def test_aggregated_and_legacy_discovery(server: ApiServer) -> None:
    status, headers, body = await get(server, "/apis", accept=AGGREGATED)
    assert status == 200
    assert headers["Content-Type"] == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    groups = {item["metadata"]["name"]: item for item in body["items"]}
    leases = groups["coordination.k8s.io"]["versions"][0]["resources"][0]
    assert leases["resource"] == "leases"
    assert leases["scope"] == "Namespaced"
    _, _, core = await get(server, "/api", accept=AGGREGATED)
    pods = next(r for r in core["items"][0]["versions"][0]["resources"] if r["resource"] == "pods")
    assert {s["subresource"] for s in pods["subresources"]} == {"status", "binding"}
    _, _, legacy = await get(server, "/api")
    assert legacy["kind"] == "APIVersions"
    _, _, v1 = await get(server, "/api/v1/")  # trailing slashes are fine
    names = {r["name"] for r in v1["resources"]}
    assert {"pods", "pods/status", "serviceaccounts/token"} <= names
    _, _, version = await get(server, "/version")
    assert version["major"] == "1"


async def test_unauthenticated_requests_are_rejected(server: ApiServer) -> None:
    status, _, body = await get(server, "/api/v1/namespaces", token="wrong")
    assert status == 401
    assert body["reason"] == "Unauthorized"


async def test_unknown_resource_is_a_404_status(server: ApiServer) -> None:
    status, _, body = await get(server, "/apis/example.com/v1/namespaces/default/widgets")
    assert status == 404
    assert body["kind"] == "Status"
    assert body["message"] == "the server could not find the requested resource"


async def test_protobuf_bodies_are_415(server: ApiServer) -> None:
    assert server.certificates is not None
    ctx = server.certificates.client_context()
    headers = {"Authorization": f"Bearer {server.user_token}", "Content-Type": "application/vnd.kubernetes.protobuf"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            server.url + "/api/v1/namespaces/default/configmaps", data=b"k8s\x00", headers=headers, ssl=ctx
        ) as resp,
    ):
        assert resp.status == 415


async def test_dry_run_writes_nothing(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    before = server.store.rv
    out = await core.create_namespaced_config_map("default", {"metadata": {"name": "dry"}}, dry_run="All")
    assert out.metadata.name == "dry"
    assert server.store.get("", "configmaps", "default", "dry") is None
    assert server.store.rv == before


async def test_closing_watches_ends_streams(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    cm = await core.create_namespaced_config_map("default", {"metadata": {"name": "w"}})
    started = asyncio.Event()
    events: list[str] = []

    async def consume() -> None:
        async with watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=cm.metadata.resource_version,
            timeout_seconds=60,
        ) as stream:
            started.set()
            async for event in stream:
                events.append(event["type"])

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 5)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not server.store.subscribers("", "configmaps"):
        assert loop.time() < deadline, "the watch never reached the server"
        await asyncio.sleep(0.01)
    assert server.close_watches("configmaps") == 1
    await asyncio.wait_for(task, 5)  # the stream ended without any event
    assert events == []


async def test_watch_honours_timeout_seconds_and_field_selector(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map("default", {"metadata": {"name": "one"}})
    await core.create_namespaced_config_map("default", {"metadata": {"name": "two"}})
    names = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with watch.Watch().stream(
        core.list_namespaced_config_map, "default", field_selector="metadata.name=two", timeout_seconds=1
    ) as stream:
        async for event in stream:
            names.append(event["object"].metadata.name)
    assert names == ["two"]
    assert 0.9 <= loop.time() - start < 5


async def test_admin_endpoints(server: ApiServer) -> None:
    status, _, _ = await get(server, "/_kubesim/requests")
    assert status == 403  # the default user is not the admin
    await get(server, "/api/v1/namespaces")
    status, _, body = await get(server, "/_kubesim/requests?user=kubesim-user", token=server.admin_token)
    assert status == 200
    assert {"user": "kubesim-user", "verb": "list", "resource": "namespaces", "count": 1} in body["counters"]
    status, _, _ = await get(
        server,
        "/_kubesim/faults",
        token=server.admin_token,
        method="POST",
        body={"action": "fail", "count": 1, "code": 500, "user": "kubesim-user"},
    )
    assert status == 200
    status, _, body = await get(server, "/api/v1/namespaces")
    assert status == 500
    assert body["reason"] == "InternalError"


async def test_cli_serve_writes_a_working_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc.yaml"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubesim.cli",
        "serve",
        "--no-controllers",
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        lines = []
        while not any("kubeconfig written" in line for line in lines):
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            if not line:
                pytest.fail("kubesim serve exited: " + "".join(lines))
            lines.append(line.decode())
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        assert cluster["server"].startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        headers = {"Authorization": "Bearer " + cfg["users"][0]["user"]["token"]}
        async with (
            aiohttp.ClientSession() as session,
            session.get(cluster["server"] + "/api/v1/namespaces/default", headers=headers, ssl=ctx) as resp,
        ):
            assert resp.status == 200
            assert json.loads(await resp.text())["metadata"]["name"] == "default"
    finally:
        proc.terminate()
        await proc.wait()
    assert proc.returncode == 0


async def test_going_offline_refuses_connections_then_recovers(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    await core.read_namespace("default")
    await server.go_offline(0.5)
    assert not server.online
    with pytest.raises(aiohttp.ClientConnectionError):
        await core.read_namespace("default")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not server.online:
        assert loop.time() < deadline, "the server did not come back"
        await asyncio.sleep(0.02)
    assert (await core.read_namespace("default")).metadata.name == "default"


async def test_watch_of_one_named_object_and_delete_collection(api: client.ApiClient, server: ApiServer) -> None:
    core = client.CoreV1Api(api)
    for name in ("keep", "drop-1", "drop-2"):
        labels = {"drop": "yes"} if name.startswith("drop") else {}
        await core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": labels}})
    status, _, body = await get(server, "/api/v1/watch/namespaces/default/configmaps/keep?timeoutSeconds=1")
    assert status == 200
    assert body["object"]["metadata"]["name"] == "keep"  # one ADDED line, then the stream ended
    await core.delete_collection_namespaced_config_map("default", label_selector="drop=yes")
    left = await core.list_namespaced_config_map("default")
    assert [i.metadata.name for i in left.items] == ["keep"]


async def test_verbs_a_resource_does_not_have_are_405(server: ApiServer) -> None:
    status, _, body = await get(server, "/apis/authentication.k8s.io/v1/tokenreviews")
    assert status == 405
    assert body["reason"] == "MethodNotAllowed"
    status, _, _ = await get(server, "/api/v1/namespaces/default/configmaps", method="PUT", body={})
    assert status == 405


async def test_watch_list_sends_initial_events_then_an_end_bookmark(server: ApiServer) -> None:
    await get(server, "/api/v1/namespaces/default/configmaps", method="POST", body={"metadata": {"name": "wl"}})
    assert server.certificates is not None
    query = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=5"
    headers = {"Authorization": f"Bearer {server.user_token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{server.url}/api/v1/namespaces/default/configmaps?{query}",
            headers=headers,
            ssl=server.certificates.client_context(),
        ) as resp,
    ):
        first = json.loads(await resp.content.readline())
        second = json.loads(await resp.content.readline())
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "wl")
    assert second["type"] == "BOOKMARK"
    assert second["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    status, _, body = await get(server, "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true")
    assert status == 422
    assert body["reason"] == "Invalid"


class _ReadOnly:
    """An authorizer that lets the default user only read: the hook RBAC will use."""

    def authorize(self, attrs: Attributes) -> str | None:
        # Like RBAC's system:basic-user, everyone may ask what they are allowed to do.
        if attrs.resource == "selfsubjectaccessreviews":
            return None
        if attrs.user.username == "kubesim-user" and attrs.verb not in ("get", "list", "watch"):
            return (
                f'{attrs.resource} is forbidden: User "{attrs.user.username}" cannot {attrs.verb} resource '
                f'"{attrs.resource}" in API group "{attrs.group}" in the namespace "{attrs.namespace}"'
            )
        return None


async def test_authorizer_hook_decides_requests_and_reviews(tmp_path: Path) -> None:
    async with running_apiserver(ServerConfig(authorizer=_ReadOnly())) as server:
        status, _, body = await get(
            server, "/api/v1/namespaces/default/configmaps", method="POST", body={"metadata": {"name": "x"}}
        )
        assert status == 403
        assert body["reason"] == "Forbidden"
        assert 'cannot create resource "configmaps"' in body["message"]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "default"}},
        }
        status, _, body = await get(
            server, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", method="POST", body=review
        )
        assert status == 201
        assert body["status"]["allowed"] is True
        review["spec"]["resourceAttributes"]["verb"] = "delete"
        _, _, body = await get(
            server, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", method="POST", body=review
        )
        assert body["status"]["allowed"] is False
        # The admin (controllers) is someone else and may still write.
        status, _, _ = await get(
            server,
            "/api/v1/namespaces/default/configmaps",
            method="POST",
            body={"metadata": {"name": "x"}},
            token=server.admin_token,
        )
        assert status == 201


async def test_the_internal_listener_speaks_plain_http_with_the_same_tokens_and_goes_offline_too() -> None:
    server = ApiServer(ServerConfig(internal_http=True))
    await server.start()
    try:
        assert server.internal_url.startswith("http://127.0.0.1:")
        assert server.url.startswith("https://")
        path = server.internal_url + "/api/v1/namespaces/default"
        async with aiohttp.ClientSession() as session:
            async with session.get(path) as resp:
                assert resp.status == 401  # no token, no answer: the same authentication as HTTPS
            admin = {"Authorization": f"Bearer {server.admin_token}"}
            async with session.get(path, headers=admin) as resp:
                assert resp.status == 200
            await server.go_offline(0.5)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(path, headers=admin):
                    pass
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not server.online:
                assert loop.time() < deadline, "the server did not come back"
                await asyncio.sleep(0.02)
            async with session.get(path, headers=admin) as resp:
                assert resp.status == 200
    finally:
        await server.stop()


async def test_without_tls_or_the_option_there_is_no_internal_listener() -> None:
    for config in (ServerConfig(), ServerConfig(tls=False, internal_http=True)):
        server = ApiServer(config)
        await server.start()
        try:
            assert server.internal_url == ""
        finally:
            await server.stop()
