"""Requests to the API server on kubernetes_asyncio's connection pool, sent without its per-request
machinery: `kube.Kube` is the only user.

kubernetes_asyncio loads the credentials and builds the aiohttp session (its TLS context: the
cluster's CA, client certificates, the server name), and both are kept. What is skipped is its
`call_api` path, which the driver never needed: a walk of every header, query parameter and body
to "sanitize" them for serialisation, the body encoded with `json`, a regular expression over the
content type and the query string built by hand, on every request and every watch. A gateway makes
~6 requests per warm create; the body is encoded with orjson here, and the URL and the constant
headers are built once. The bearer token is read per request through the configuration's own
`auth_settings()`, so a token the configuration refreshes (in-cluster projected tokens, exec
plugins) is used as it rotates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client as k8s_client

from warmshell.drivers.kubernetes.objects import Obj

__all__ = ["Transport"]


class Transport:
    """Sends one request on the ApiClient's session; the caller reads and releases the response."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        rest = api_client.rest_client
        self._configuration = api_client.configuration
        self._session: aiohttp.ClientSession = rest.pool_manager
        # A string prefix, as kubernetes_asyncio joins it: a host may carry a path (an API proxy's).
        self._host = str(self._configuration.host or "")
        self._default_headers = {str(k): str(v) for k, v in api_client.default_headers.items()}
        options: dict[str, Any] = {}
        if rest.proxy:
            options["proxy"] = rest.proxy
        if rest.proxy_headers:
            options["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            options["server_hostname"] = rest.server_hostname
        self._options = options

    @property
    def session(self) -> aiohttp.ClientSession:
        """The shared aiohttp session (its connector is the connection pool)."""
        return self._session

    async def headers(self, content_type: str) -> dict[str, str]:
        """The request's headers: constant ones, and the credential as the configuration has it now."""
        headers = {**self._default_headers, "Accept": "application/json", "Content-Type": content_type}
        # Only BearerToken is ever set by the loaders; client certificates live in the TLS context.
        setting = (await self._configuration.auth_settings()).get("BearerToken")
        if setting and setting.get("value"):
            headers[str(setting["key"])] = str(setting["value"])
        return headers

    async def send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, Any]] = (),
        body: Obj | None = None,
        content_type: str = "application/json",
        limits: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """The response of one request (status not checked; the caller reads and releases it)."""
        return await self._session.request(
            method,
            self._host + path,
            params=[(k, str(v)) for k, v in query] or None,
            data=orjson.dumps(body) if body is not None else None,
            headers=await self.headers(content_type),
            timeout=limits,
            **self._options,
        )
