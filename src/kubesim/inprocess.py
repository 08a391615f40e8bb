"""The controllers' and kubelet's API client when they run in the API server's own process.

Every request still goes through the server's one handler, as an HTTP request would: the admin
token is authenticated, the request authorised, injected faults applied, the verb run through the
same store rules (admission, schema validation, resourceVersions) and the request logged; so
every write emits the same watch events to external watchers and kubectl, helm and the tests see
no difference. What is gone is the transport: no socket, HTTP parsing or TLS; bodies go in as
objects (a copy the server may keep), answers come back as the caller's own copy of the stored
object (decoded from the encoding the store keeps for watchers and the next write), and watch
events arrive as the stored objects themselves instead of JSON encoded by the server and decoded
again here.

The objects a watch yields are the store's own (immutable by the store's rule: every write stores
a fresh dict), so its consumers, the informers, must treat them as read-only, as client-go's
informers already require: the controllers copy what they edit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiDict

from kubesim import jsonwire
from kubesim.apiserver.handlers import Handler
from kubesim.apiserver.localrequest import LocalRequest
from kubesim.controllers import client as kc

if TYPE_CHECKING:
    from kubesim.apiserver.server import ApiServer


class InProcessClient(kc.KubeClient):
    """A ``KubeClient`` answered by an ``ApiServer`` in this process, with ``token``'s identity."""

    def __init__(self, server: ApiServer, token: str) -> None:
        certificates = server.certificates
        super().__init__(server.url, token, ca_pem=certificates.ca_pem if certificates is not None else None)
        self._server = server
        self._handler = Handler(server)
        self._authorization = f"Bearer {token}"

    def _request(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        body: Any,
        content_type: str,
        read_only_answer: bool = False,
    ) -> LocalRequest:
        if not self._server.online:
            # The server is "restarting" (its offline fault): its own components lose it too.
            raise aiohttp.ClientConnectionError("kubesim's API server is offline")
        headers = CIMultiDict({"Authorization": self._authorization, "Accept": "application/json"})
        if body is not None:
            headers["Content-Type"] = content_type
        # A copy per attempt: the server keeps and edits what it is given, the caller keeps its own.
        payload = None if body is None else jsonwire.copy_of(body)
        return LocalRequest(
            method, path, MultiDict(params or {}), headers, payload=payload, read_only_answer=read_only_answer
        )

    async def _exchange(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        body: Any,
        content_type: str,
        read_only_answer: bool = False,
    ) -> tuple[int, bytes, str | None, kc.Obj | None]:
        request = self._request(method, path, params, body, content_type, read_only_answer)
        resp = await self._handler.handle(request)
        answer = request.answer if resp.status < 300 else None
        return resp.status, _body(resp), resp.headers.get("Retry-After"), answer

    async def aclose(self) -> None:
        """Nothing to close: no connections."""

    async def watch(
        self,
        res: kc.Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
    ) -> AsyncIterator[kc.Obj]:
        """Yield watch events (``type`` and the stored ``object``) until the watch ends."""
        params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_seconds)}
        if label_selector:
            params["labelSelector"] = label_selector
        request = self._request("GET", res.path(namespace), params, None, "")
        resp = await self._handler.handle(request)
        opened = request.opened
        if opened is None:
            body = _body(resp)
            raise kc.ApiError(resp.status, kc.parse_status(body), body.decode(errors="replace"))
        watcher = opened.watcher
        expiry = asyncio.get_running_loop().call_later(opened.duration, watcher.expire)
        try:
            while True:
                while watcher.events:
                    kind, obj = watcher.events.popleft()
                    yield {"type": kind, "object": obj}
                if watcher.closed or watcher.expired:
                    return
                await watcher.next_events()
        finally:
            expiry.cancel()
            opened.bucket.subscribers.discard(watcher)


def _body(resp: web.StreamResponse) -> bytes:
    body = resp.body if isinstance(resp, web.Response) else b""
    return body if isinstance(body, bytes) else b""
