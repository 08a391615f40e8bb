"""kubesim's plain-HTTP loopback listener (the one its controllers use) grants nothing the HTTPS
one does not: a pod's ServiceAccount token that reaches it gets the same RBAC answers, a forged or
missing token gets 401, and impersonation headers are checked the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kubesim.apiserver import ApiServer, ServerConfig
from kubesim.apiserver.rest import WriteOptions
from kubesim.testing import running_apiserver


async def call(url: str, path: str, token: str, *, server: ApiServer, headers: dict[str, str] | None = None) -> int:
    sent = {"Accept": "application/json", "Authorization": f"Bearer {token}", **(headers or {})}
    ssl = server.certificates.client_context() if url.startswith("https") and server.certificates else None
    async with aiohttp.ClientSession() as session, session.get(url + path, headers=sent, ssl=ssl) as resp:
        return resp.status


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with running_apiserver(ServerConfig(rbac=True, internal_http=True)) as running:
        for plural, body, ns in (
            ("namespaces", {"metadata": {"name": "apps"}}, ""),
            ("serviceaccounts", {"metadata": {"name": "bot"}}, "apps"),
            ("configmaps", {"metadata": {"name": "c"}, "data": {"k": "v"}}, "apps"),
        ):
            rt = running.registry.get("", plural)
            assert rt is not None
            running.rest.create(rt, "v1", ns, body, WriteOptions())
        yield running


async def sa_token(server: ApiServer) -> str:
    sent = {"Authorization": f"Bearer {server.admin_token}"}
    path = "/api/v1/namespaces/apps/serviceaccounts/bot/token"
    async with aiohttp.ClientSession() as session, session.post(server.internal_url + path, headers=sent, json={}) as r:
        assert r.status == 201
        body: Any = await r.json()
    return str(body["status"]["token"])


async def test_a_service_account_gets_the_same_answers_on_both_listeners(server: ApiServer) -> None:
    assert server.internal_url
    token = await sa_token(server)
    for path in ("/api/v1/namespaces/apps/configmaps/c", "/api/v1/namespaces/apps/secrets", "/api/v1/nodes"):
        over_tls = await call(server.url, path, token, server=server)
        plain = await call(server.internal_url, path, token, server=server)
        assert over_tls == plain == 403, path


async def test_no_forged_or_missing_token_is_let_in(server: ApiServer) -> None:
    path = "/api/v1/namespaces/apps/configmaps/c"
    for token in ("", "not-a-token", server.admin_token[:-2] + "xx"):
        assert await call(server.internal_url, path, token, server=server) == 401, token


async def test_impersonation_is_authorized_the_same_way(server: ApiServer) -> None:
    token = await sa_token(server)
    path = "/api/v1/namespaces/apps/configmaps/c"
    as_admin = {"Impersonate-User": "kubesim-admin", "Impersonate-Group": "system:masters"}
    assert await call(server.internal_url, path, token, server=server, headers=as_admin) == 403
    assert await call(server.url, path, token, server=server, headers=as_admin) == 403
