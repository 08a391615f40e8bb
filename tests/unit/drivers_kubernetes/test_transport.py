"""The adapter's requests as an API server receives them (a real aiohttp server on loopback): the
credential as the configuration has it at each request, the JSON body, the query, the content
type, a server URL with a path prefix, and watch lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from warmshell.drivers.kubernetes import kube

from .fakes import config

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: first-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


class Recorder:
    """An API server that records each request and answers with an object naming it."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = {
            "method": request.method,
            "path": request.path,
            "query": list(request.query.items()),
            "authorization": request.headers.get("Authorization", ""),
            "content_type": request.headers.get("Content-Type", ""),
            "body": json.loads(body) if body else None,
        }
        self.requests.append(seen)
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            for i in range(3):
                event = {"type": "ADDED", "object": {"metadata": {"name": f"o{i}", "resourceVersion": str(i)}}}
                await response.write(json.dumps(event).encode() + b"\n\n")  # a blank line between
            await response.write_eof()
            return response
        return web.json_response({"kind": "Thing", "metadata": {"name": "answer"}, "seen": seen["path"]})


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[Recorder, str]]:
    """A recording API server on a free loopback port, and its URL."""
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield recorder, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[tuple[Recorder, str]]:
    async with serving() as running:
        yield running


async def connect(tmp_path: Path, server_url: str) -> kube.Kube:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(server=server_url))
    return await kube.Kube.connect(config(kubeconfig=str(path), credentials="kubeconfig"))


async def test_a_write_carries_its_body_as_json_with_its_content_type_and_the_token(
    server: tuple[Recorder, str], tmp_path: Path
) -> None:
    recorder, url = server
    api = await connect(tmp_path, url)
    try:
        patch = {"metadata": {"labels": {"a": "b"}}, "spec": {"replicas": 3, "ok": True, "none": None}}
        answer = await api.merge_patch(kube.PODS, "ns", "p", patch)
        await api.create(kube.PODS, "ns", {"metadata": {"name": "q"}})
    finally:
        await api.aclose()
    assert answer["seen"] == "/api/v1/namespaces/ns/pods/p"
    patched, created = recorder.requests
    assert (patched["method"], patched["body"], patched["content_type"]) == ("PATCH", patch, kube.MERGE_PATCH)
    assert (created["method"], created["content_type"]) == ("POST", "application/json")
    assert patched["authorization"] == created["authorization"] == "Bearer first-token"


async def test_a_refreshed_credential_is_sent_from_the_next_request_on(
    server: tuple[Recorder, str], tmp_path: Path
) -> None:
    recorder, url = server
    api = await connect(tmp_path, url)
    try:
        await api.get(kube.PODS, "ns", "p")

        # What the in-cluster loader and exec plugins install: the token re-read per request.
        def refresh(configuration: Any) -> None:
            configuration.api_key["BearerToken"] = "Bearer rotated-token"  # as the loaders store it

        api._api.configuration.refresh_api_key_hook = refresh
        await api.get(kube.PODS, "ns", "p")
    finally:
        await api.aclose()
    assert [r["authorization"] for r in recorder.requests] == ["Bearer first-token", "Bearer rotated-token"]


async def test_a_server_url_with_a_path_keeps_it_and_a_watch_skips_blank_lines(
    server: tuple[Recorder, str], tmp_path: Path
) -> None:
    recorder, url = server
    api = await connect(tmp_path, url + "/k8s/clusters/c-1")
    try:
        events = [e async for e in api.watch(kube.PODS, "ns", resource_version="7", label_selector="a=b,c")]
    finally:
        await api.aclose()
    assert [e["object"]["metadata"]["name"] for e in events] == ["o0", "o1", "o2"]
    (watch,) = recorder.requests
    assert watch["path"] == "/k8s/clusters/c-1/api/v1/namespaces/ns/pods"
    assert ("labelSelector", "a=b,c") in watch["query"]
    assert ("resourceVersion", "7") in watch["query"]


async def listed_with(selector: str, tmp_path: Path) -> list[tuple[str, str]]:
    """The query a LIST with this label selector reached a fresh server with."""
    async with serving() as (recorder, url):
        api = await connect(tmp_path, url)
        try:
            await api.list(kube.PODS, "ns", label_selector=selector)
        finally:
            await api.aclose()
    query: list[tuple[str, str]] = recorder.requests[0]["query"]
    return query


@settings(max_examples=25, deadline=None)
@given(selector=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1))
def test_any_label_selector_reaches_the_server_unchanged(selector: str, tmp_path_factory: Any) -> None:
    query = asyncio.run(listed_with(selector, tmp_path_factory.mktemp("k")))
    assert query == [("labelSelector", selector)]
