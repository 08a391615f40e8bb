"""RBAC at the HTTP layer of an RBAC-enabled server: non-resource URLs, impersonation, the request
attributes upstream derives (fieldSelector names, namespace objects), rules reviews, and that the
default server is unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kubesim.apiserver import ApiServer, ServerConfig
from kubesim.apiserver.rest import WriteOptions
from kubesim.testing import running_apiserver

GROUP = "rbac.authorization.k8s.io"
SA_USER = "system:serviceaccount:apps:bot"


async def call(
    server: ApiServer,
    path: str,
    token: str,
    *,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    assert server.certificates is not None
    sent = {"Accept": "application/json", "Authorization": f"Bearer {token}", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, server.url + path, headers=sent, json=body, ssl=server.certificates.client_context()
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def setup(server: ApiServer, plural: str, body: dict[str, Any], namespace: str = "") -> None:
    """Create as the server itself (test setup, like the admin would)."""
    group = "" if plural in ("namespaces", "serviceaccounts", "configmaps") else GROUP
    rt = server.registry.get(group, plural)
    assert rt is not None
    server.rest.create(rt, "v1", namespace, body, WriteOptions())


async def sa_token(server: ApiServer) -> str:
    status, body = await call(
        server, "/api/v1/namespaces/apps/serviceaccounts/bot/token", server.admin_token, method="POST", body={}
    )
    assert status == 201
    return str(body["status"]["token"])


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with running_apiserver(ServerConfig(rbac=True)) as running:
        for ns in ("apps", "other"):
            setup(running, "namespaces", {"metadata": {"name": ns}})
        setup(running, "serviceaccounts", {"metadata": {"name": "bot"}}, "apps")
        yield running


async def test_non_resource_urls_follow_the_bootstrap_policy(server: ApiServer) -> None:
    token = await sa_token(server)
    for path in ("/api", "/apis", "/apis/rbac.authorization.k8s.io/v1", "/version", "/openid/v1/jwks"):
        status, _ = await call(server, path, token)
        assert status == 200, path
    status, body = await call(server, "/metrics", token)
    assert status == 403
    assert body["message"] == f'forbidden: User "{SA_USER}" cannot get path "/metrics"'
    # The default user and the admin are system:masters: RBAC does not apply to them.
    for i, masters in enumerate((server.user_token, server.admin_token)):
        status, _ = await call(
            server, "/api/v1/namespaces/apps/configmaps", masters, method="POST", body={"metadata": {"name": f"c{i}"}}
        )
        assert status == 201


async def test_resource_names_allow_a_list_or_watch_pinned_by_field_selector(server: ApiServer) -> None:
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"], "resourceNames": ["mine"]}
    setup(server, "roles", {"metadata": {"name": "mine"}, "rules": [rule]}, "apps")
    subject = {"kind": "ServiceAccount", "name": "bot"}
    setup(
        server,
        "rolebindings",
        {"metadata": {"name": "mine"}, "roleRef": {"kind": "Role", "name": "mine"}, "subjects": [subject]},
        "apps",
    )
    token = await sa_token(server)
    base = "/api/v1/namespaces/apps/configmaps"
    assert (await call(server, base + "?fieldSelector=metadata.name%3Dmine", token))[0] == 200
    status, body = await call(server, base + "?fieldSelector=metadata.name%3Dtheirs", token)
    assert status == 403
    assert body["message"].startswith('configmaps "theirs" is forbidden:')
    status, body = await call(server, base, token)
    assert status == 403
    assert body["message"] == (
        f'configmaps is forbidden: User "{SA_USER}" cannot list resource "configmaps" in API group "" '
        'in the namespace "apps"'
    )
    assert body["details"]["kind"] == "configmaps"


async def test_a_namespace_object_is_inside_its_own_namespace(server: ApiServer) -> None:
    rule = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}
    setup(server, "clusterroles", {"metadata": {"name": "ns-reader"}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": "bot"}
    ref = {"kind": "ClusterRole", "name": "ns-reader"}
    setup(server, "rolebindings", {"metadata": {"name": "ns"}, "roleRef": ref, "subjects": [subject]}, "apps")
    token = await sa_token(server)
    assert (await call(server, "/api/v1/namespaces/apps", token))[0] == 200
    status, body = await call(server, "/api/v1/namespaces/other", token)
    assert status == 403
    assert body["message"] == (
        f'namespaces "other" is forbidden: User "{SA_USER}" cannot get resource "namespaces" in API group "" '
        'in the namespace "other"'
    )


async def test_impersonation_needs_the_impersonate_verb(server: ApiServer) -> None:
    token = await sa_token(server)
    status, body = await call(server, "/api/v1/namespaces/apps/pods", token, headers={"Impersonate-User": "alice"})
    assert status == 403
    assert body["message"] == (
        f'users "alice" is forbidden: User "{SA_USER}" cannot impersonate resource "users" in API group "" '
        "at the cluster scope"
    )
    # The admin may impersonate, and is then exactly as powerful as the impersonated account.
    as_bot = {"Impersonate-User": SA_USER}
    status, body = await call(server, "/api/v1/namespaces/apps/pods", server.admin_token, headers=as_bot)
    assert status == 403
    assert body["message"].startswith(f'pods is forbidden: User "{SA_USER}" cannot list')
    status, body = await call(
        server,
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        server.admin_token,
        method="POST",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        headers=as_bot,
    )
    assert status == 201
    assert body["status"]["userInfo"] == {
        "username": SA_USER,
        "groups": ["system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated"],
    }
    status, _ = await call(server, "/api", server.admin_token, headers={"Impersonate-Group": "x"})
    assert status == 400


async def test_rules_review_lists_what_the_caller_holds(server: ApiServer) -> None:
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["p"]}
    setup(server, "roles", {"metadata": {"name": "r"}, "rules": [rule]}, "apps")
    subject = {"kind": "ServiceAccount", "name": "bot"}
    setup(
        server,
        "rolebindings",
        {"metadata": {"name": "r"}, "roleRef": {"kind": "Role", "name": "r"}, "subjects": [subject]},
        "apps",
    )
    token = await sa_token(server)
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "apps"}}
    status, body = await call(
        server, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", token, method="POST", body=review
    )
    assert status == 201
    assert rule in body["status"]["resourceRules"]
    assert {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]} in (
        body["status"]["nonResourceRules"]
    )
    review["spec"]["namespace"] = "other"
    _, body = await call(
        server, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", token, method="POST", body=review
    )
    assert rule not in body["status"]["resourceRules"]


async def test_without_rbac_nothing_changes() -> None:
    async with running_apiserver() as server:
        setup(server, "namespaces", {"metadata": {"name": "apps"}})
        setup(server, "serviceaccounts", {"metadata": {"name": "bot"}}, "apps")
        token = await sa_token(server)
        status, body = await call(server, "/apis/rbac.authorization.k8s.io/v1/clusterroles", server.admin_token)
        assert (status, body["items"]) == (200, [])  # no bootstrap policy either
        status, _ = await call(
            server, "/api/v1/namespaces/apps/configmaps", token, method="POST", body={"metadata": {"name": "c"}}
        )
        assert status == 201
