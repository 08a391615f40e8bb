"""The one module through which kubesim's controllers and kubelet reach the API server, over HTTP.

A deliberately small async client on aiohttp: JSON verbs, merge patches (optionally carrying a
resourceVersion for optimistic locking), the status subresource, watch streams and TokenRequest.
Temporary failures (connection errors, 5xx, 429 with Retry-After) are retried along a finite
backoff; everything else surfaces as ``ApiError`` with the Status object's code and reason.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml

from kubesim import jsonwire

Obj = dict[str, Any]
log = logging.getLogger(__name__)

#: Seconds between attempts for temporary failures; one attempt more than entries.
RETRY_BACKOFF = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
MERGE_PATCH = "application/merge-patch+json"
#: How long an idle connection to the API server is kept for reuse (aiohttp's server closes at 75 s).
KEEPALIVE_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Resource:
    """API coordinates of a resource type."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


PODS = Resource("", "v1", "pods")
SERVICES = Resource("", "v1", "services")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
EVENTS_V1 = Resource("events.k8s.io", "v1", "events")
NODES = Resource("", "v1", "nodes", namespaced=False)
PVCS = Resource("", "v1", "persistentvolumeclaims")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
REPLICASETS = Resource("apps", "v1", "replicasets")
ENDPOINTSLICES = Resource("discovery.k8s.io", "v1", "endpointslices")
SANDBOXES = Resource("agents.x-k8s.io", "v1beta1", "sandboxes")
TEMPLATES = Resource("extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates")
CLAIMS = Resource("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims")
POOLS = Resource("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools")


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: Obj | None, text: str = "") -> None:
        self.status = status
        self.body = body or {}
        self.reason = str(self.body.get("reason", ""))
        message = self.body.get("message") or text
        super().__init__(f"{status} {self.reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.status == 410


def _temporary(status: int) -> bool:
    return status == 429 or status >= 500


class KubeClient:
    """Async JSON client bound to one API server URL and bearer token."""

    def __init__(self, url: str, token: str, *, ca_pem: bytes | str | None = None, via: str = "") -> None:
        """`url` is the API server as the cluster knows it (what pods are told); requests go to
        `via` instead when given (kubesim's own plain-HTTP loopback listener)."""
        self._url = url.rstrip("/")
        self._base = (via or url).rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None
        self.ca_pem = ca_pem.encode() if isinstance(ca_pem, str) else ca_pem
        if ca_pem:
            data = ca_pem.decode() if isinstance(ca_pem, bytes) else ca_pem
            self._ssl = ssl.create_default_context(cadata=data)

    @property
    def url(self) -> str:
        """The API server's base URL."""
        return self._url

    @classmethod
    def from_kubeconfig(cls, path: str, *, via: str = "") -> KubeClient:
        """A client for the current context of a kubeconfig with a bearer token (kubesim's kind)."""
        with open(path) as handle:
            config = yaml.safe_load(handle)
        ctx_name = config.get("current-context")
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        ca = cluster.get("certificate-authority-data")
        return cls(cluster["server"], user["token"], ca_pem=base64.b64decode(ca) if ca else None, via=via)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Many concurrent reconciles and watches: lift aiohttp's default 100-connection cap.
            # Idle connections are kept a minute, not aiohttp's 15 s (still under the API server's
            # 75 s): each burst of reconciles wider than the last 15 s's opened new TLS connections,
            # and their handshakes were the largest single cost of this process under warm creates.
            connector = aiohttp.TCPConnector(
                limit=0, ssl=self._ssl if self._ssl else True, keepalive_timeout=KEEPALIVE_SECONDS
            )
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        read_only_answer: bool = False,
    ) -> Obj:
        """One request, retried along ``RETRY_BACKOFF`` while the failure is temporary.

        ``read_only_answer``: the caller never edits the answer, so a client in the server's own
        process may hand over the stored object itself rather than decode a copy of it.
        """
        attempts = len(RETRY_BACKOFF) + 1
        for attempt in range(1, attempts + 1):
            try:
                status, text, retry_after, answer = await self._exchange(
                    method, path, params, body, content_type, read_only_answer
                )
                if status < 300:
                    if answer is not None:
                        return answer
                    return jsonwire.loads(text) if text else {}
                parsed = parse_status(text)
                if not _temporary(status) or attempt == attempts:
                    raise ApiError(status, parsed, text.decode(errors="replace"))
                delay = _retry_after(retry_after, attempt)
                log.debug("%s %s: %s, attempt %d/%d", method, path, status, attempt, attempts)
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                if attempt == attempts:
                    raise
                delay = RETRY_BACKOFF[attempt - 1]
                log.debug("%s %s: %r, attempt %d/%d", method, path, exc, attempt, attempts)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _exchange(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        body: Any,
        content_type: str,
        read_only_answer: bool = False,
    ) -> tuple[int, bytes, str | None, Obj | None]:
        """One request over HTTP: (status, body, Retry-After, and no decoded answer: the caller
        decodes the body)."""
        url = self._base + path + ("?" + urlencode(params) if params else "")
        data = None if body is None else jsonwire.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._http().request(method, url, data=data, headers=headers) as resp:
            return resp.status, await resp.read(), resp.headers.get("Retry-After"), None

    async def get(self, res: Resource, namespace: str | None, name: str) -> Obj:
        return await self.request("GET", res.path(namespace, name))

    async def list_objects(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        return await self.request("GET", res.path(namespace), params=params)

    async def create(self, res: Resource, namespace: str | None, body: Obj) -> Obj:
        return await self.request("POST", res.path(namespace), body=body)

    async def update(self, res: Resource, body: Obj, *, sub: str = "") -> Obj:
        """PUT. A status write's answer is read-only (see ``patch``)."""
        meta = body["metadata"]
        path = res.path(meta.get("namespace"), meta["name"], sub)
        return await self.request("PUT", path, body=body, read_only_answer=sub == "status")

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Obj, *, sub: str = "") -> Obj:
        """JSON merge patch. A ``metadata.resourceVersion`` in it makes it an optimistic-lock write.

        A status write's answer is read-only: the controllers and the kubelet read at most its
        metadata (the resourceVersion they wrote), and there are ~11 status writes per warm claim."""
        path = res.path(namespace, name, sub)
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH, read_only_answer=sub == "status")

    async def delete(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str | None = None,
        grace_period: int | None = None,
    ) -> Obj:
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def request_token(
        self,
        namespace: str,
        service_account: str,
        *,
        audiences: list[str],
        expiration_seconds: int,
        pod: Obj,
    ) -> Obj:
        """TokenRequest bound to a Pod; returns the TokenRequest status (token, expirationTimestamp)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": audiences,
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        path = SERVICEACCOUNTS.path(namespace, service_account, "token")
        result = await self.request("POST", path, body=body)
        status: Obj = result.get("status") or {}
        return status

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
    ) -> AsyncIterator[Obj]:
        """Yield watch events (dicts with ``type`` and ``object``) until the server ends the stream."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        url = self._base + res.path(namespace) + "?" + urlencode(params)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        async with self._http().get(url, timeout=timeout) as resp:
            if resp.status >= 300:
                text = await resp.text()
                raise ApiError(resp.status, parse_status(text), text)
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                # Events are newline-delimited JSON; a chunk may hold several or half of one.
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield jsonwire.loads(line)
            if buf.strip():
                yield jsonwire.loads(buf)


def parse_status(text: str | bytes) -> Obj | None:
    """The Status object of an error answer, if its body is one."""
    try:
        value = jsonwire.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _retry_after(header: str | None, attempt: int) -> float:
    if header:
        try:
            return max(0.0, float(header))
        except ValueError:
            pass
    return RETRY_BACKOFF[attempt - 1]
