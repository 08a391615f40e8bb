"""The only module that talks to the Kubernetes API: a thin async adapter over kubernetes_asyncio
(its credentials and connection pool; requests go out through `transport`).

Everything else in the driver gets plain dicts from here and sees Kubernetes failures as a few
exception classes decided at this boundary: `NotFound` (404), `AlreadyExists` / `Conflict` (409),
`Gone` (410, watches only), `Temporary` (429, 5xx, timeouts, dropped connections) and `Rejected`
(every other status). One `Kube` — one `ApiClient`, one aiohttp connection pool — serves every
call of the driver, and a gateway process runs one driver; watches are separate streaming requests
on the same pool. Every call is bounded by a timeout. Temporary failures of calls that are safe to
repeat are retried by a `RetryPolicy` (data, not code); a create is never retried after an
ambiguous failure — the driver reads back instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import aiohttp
import aiohttp.helpers
import orjson
import yarl
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
    UnavailableError,
    WarmshellError,
)
from warmshell.drivers.kubernetes.objects import Obj
from warmshell.drivers.kubernetes.transport import Transport

__all__ = [
    "CONFIGMAPS",
    "EVENTS",
    "EXTENSIONS_GROUP",
    "LEASES",
    "PODS",
    "SANDBOX_CLAIMS",
    "SANDBOX_TEMPLATES",
    "SANDBOX_VERSIONS",
    "SANDBOX_WARM_POOLS",
    "TOKEN_REVIEWS",
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Gone",
    "Kube",
    "NotFound",
    "Obj",
    "Rejected",
    "Resource",
    "RetryPolicy",
    "Temporary",
    "sandboxes",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MERGE_PATCH: Final = "application/merge-patch+json"
# The longest Retry-After we honour; a server asking for more gets our own backoff instead.
MAX_RETRY_AFTER_SECONDS: Final = 30.0


@dataclass(frozen=True)
class Resource:
    """A REST resource: where its objects live and what they are called."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        """`v1` for the core group, `group/version` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str = "", subresource: str = "") -> str:
        """The URL path of the collection (no name) or of one object."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


PODS: Final = Resource("", "v1", "pods", "Pod")
EVENTS: Final = Resource("", "v1", "events", "Event")
TOKEN_REVIEWS: Final = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview")
SANDBOX_GROUP: Final = "agents.x-k8s.io"
# Tried in this order, once per process: v1beta1 is the storage version since agent-sandbox 0.5.
SANDBOX_VERSIONS: Final = ("v1beta1", "v1alpha1")


CONFIGMAPS: Final = Resource("", "v1", "configmaps", "ConfigMap")
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease")
EXTENSIONS_GROUP: Final = "extensions.agents.x-k8s.io"
SANDBOX_TEMPLATES: Final = Resource(EXTENSIONS_GROUP, "v1beta1", "sandboxtemplates", "SandboxTemplate")
SANDBOX_WARM_POOLS: Final = Resource(EXTENSIONS_GROUP, "v1beta1", "sandboxwarmpools", "SandboxWarmPool")
SANDBOX_CLAIMS: Final = Resource(EXTENSIONS_GROUP, "v1beta1", "sandboxclaims", "SandboxClaim")


def sandboxes(version: str) -> Resource:
    """The agent-sandbox `Sandbox` resource at `version`."""
    return Resource(SANDBOX_GROUP, version, "sandboxes", "Sandbox")


# -- errors ---------------------------------------------------------------------------------------


class ApiError(WarmshellError):
    """A Kubernetes API failure; `status` is the HTTP status (0 when no response arrived)."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"Kubernetes API {status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.api_message = message
        self.retry_after = retry_after


class NotFound(ApiError, NotFoundError):
    """404: the object (or the resource) does not exist."""


class Conflict(ApiError, ConflictError):
    """409 other than AlreadyExists: a precondition or resourceVersion did not hold."""


class AlreadyExists(ApiError, AlreadyExistsError):
    """409 AlreadyExists on create."""


class Gone(ApiError):
    """410: the requested resourceVersion is older than the server's history; relist."""


class Temporary(ApiError, UnavailableError):
    """429, 5xx, a timeout or a dropped connection: try again later; a write's outcome is unknown."""


class Rejected(ApiError, FailedPreconditionError):
    """Any other error status (400, 401, 403, 422, ...): repeating the call cannot help."""


def error_for(status: int, body: bytes, headers: Any = None) -> ApiError:
    """The exception for a non-2xx response (the body is a Kubernetes Status when it parses)."""
    reason, message = "", body[:300].decode(errors="replace")
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        reason = str(parsed.get("reason") or "")
        message = str(parsed.get("message") or message)
    retry_after = _retry_after(headers)
    if status == 404:
        return NotFound(status, reason or "NotFound", message)
    if status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(status, reason or "Conflict", message)
    if status == 410:
        return Gone(status, reason or "Expired", message)
    if status == 429 or status >= 500:
        return Temporary(status, reason or "ServerError", message, retry_after=retry_after)
    return Rejected(status, reason or "Rejected", message)


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    value = headers.get("Retry-After")
    try:
        return min(float(value), MAX_RETRY_AFTER_SECONDS) if value is not None else None
    except ValueError:
        return None


# -- retries --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Delays between attempts; `len(delays)` retries after the first attempt."""

    delays: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0)

    @property
    def attempts(self) -> int:
        """How many attempts in all."""
        return len(self.delays) + 1

    async def run(self, what: str, call: Callable[[], Awaitable[T]], *, only_unprocessed: bool = False) -> T:
        """Run `call`, retrying `Temporary` failures. With `only_unprocessed`, only 429 is retried
        (the server did not act on the request), so a non-idempotent write is never repeated."""
        attempt = 1
        while True:
            try:
                return await call()
            except Temporary as exc:
                retryable = exc.status == 429 or not only_unprocessed
                if not retryable or attempt >= self.attempts:
                    raise
                delay = max(self.delays[attempt - 1], exc.retry_after or 0.0)
                log.info("%s: %s; attempt %d/%d in %.2fs", what, exc, attempt + 1, self.attempts, delay)
                attempt += 1
                await asyncio.sleep(delay)


# -- the adapter ----------------------------------------------------------------------------------


def _read_environment_once(api_client: k8s_client.ApiClient, host: str) -> None:
    """kubernetes_asyncio's session trusts the environment, so aiohttp re-reads the proxy variables
    and ~/.netrc for every request, the netrc in a thread of the default executor (a thread hop
    and a file read per API call, ~14 % of a gateway's busy time under creates). The proxy for
    the API server (HTTPS_PROXY / NO_PROXY, with netrc credentials for it) is decided here once,
    the same way aiohttp would decide it, and the per-request lookup is turned off. A proxy set in
    the kubeconfig stays as it is."""
    rest = api_client.rest_client
    if host and not rest.proxy:
        try:
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(host))
        except LookupError:  # no proxy for this host
            pass
        else:
            rest.proxy = str(proxy.with_user(auth.login).with_password(auth.password) if auth else proxy)
    # aiohttp has no public setter; the session has sent nothing yet.
    rest.pool_manager._trust_env = False


class Kube:
    """One API client for the whole driver. Create with `await Kube.connect(config)`."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        timeout: float,
        watch_timeout: int,
        retry: RetryPolicy,
    ) -> None:
        self._api = api_client
        self._transport = Transport(api_client)
        self._request_timeout = aiohttp.ClientTimeout(total=timeout)
        self._timeout = timeout
        self._watch_timeout = watch_timeout
        self.retry = retry
        self._sandbox_version: str | None = None
        self._probe_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, config: KubernetesDriverConfig) -> Kube:
        """Load credentials (in-cluster or kubeconfig) into one shared ApiClient."""
        configuration = k8s_client.Configuration()
        in_cluster = config.credentials == "in-cluster" or (
            config.credentials == "auto" and not config.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST")
        )
        try:
            if in_cluster:
                # kubernetes_asyncio ships this loader without annotations.
                k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                await k8s_config.load_kube_config(
                    config_file=config.kubeconfig or None,
                    context=config.context or None,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (k8s_config.ConfigException, OSError, TypeError) as exc:
            raise FailedPreconditionError(f"cannot load Kubernetes credentials: {exc}") from exc
        # Watches hold connections open; leave room for them beside ordinary calls.
        configuration.connection_pool_maxsize = 32
        api_client = k8s_client.ApiClient(configuration)
        _read_environment_once(api_client, configuration.host or "")
        return cls(
            api_client,
            timeout=config.api_timeout_seconds,
            watch_timeout=config.watch_timeout_seconds,
            retry=RetryPolicy(tuple(config.retry_delays_seconds)),
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._api.close()

    # -- raw requests ---------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, Any]] = (),
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One bounded request; the parsed JSON body of a 2xx answer."""
        try:
            async with asyncio.timeout(self._timeout):
                response = await self._transport.send(
                    method, path, query=query, body=body, content_type=content_type, limits=self._request_timeout
                )
                try:
                    data = await response.read()
                finally:
                    response.release()
        except TimeoutError as exc:
            raise Temporary(0, "Timeout", f"{method} {path}: no answer within {self._timeout}s") from exc
        except aiohttp.ClientError as exc:
            raise Temporary(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        if not 200 <= response.status < 300:
            raise error_for(response.status, data, response.headers)
        try:
            parsed = orjson.loads(data) if data else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise Temporary(response.status, "BadResponse", f"{method} {path}: not a JSON object")
        return parsed

    # -- verbs ----------------------------------------------------------------------------------

    async def get(self, resource: Resource, namespace: str, name: str) -> Obj:
        """GET one object (retried: reads are safe to repeat)."""
        path = resource.path(namespace, name)
        return await self.retry.run(f"get {path}", lambda: self._request("GET", path))

    async def list(
        self,
        resource: Resource,
        namespace: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
    ) -> Obj:
        """LIST (the whole List object, so callers can watch from its resourceVersion)."""
        query: list[tuple[str, Any]] = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if limit:
            query.append(("limit", limit))
        path = resource.path(namespace)
        return await self.retry.run(f"list {path}", lambda: self._request("GET", path, query=query))

    async def create(self, resource: Resource, namespace: str, body: Obj) -> Obj:
        """POST; retried only on 429 (not processed). Any other Temporary means: outcome unknown."""
        path = resource.path(namespace)
        return await self.retry.run(
            f"create in {path}", lambda: self._request("POST", path, body=body), only_unprocessed=True
        )

    async def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        *,
        uid: str = "",
        resource_version: str = "",
        propagation: str = "Background",
    ) -> Obj:
        """DELETE with optional preconditions; repeating it is safe (404 or 409 the second time)."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        path = resource.path(namespace, name)
        return await self.retry.run(f"delete {path}", lambda: self._request("DELETE", path, body=options))

    async def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: Obj, *, subresource: str = ""
    ) -> Obj:
        """PATCH with `application/merge-patch+json` (the only patch type custom resources accept
        besides JSON patch and apply). Not retried: callers guard with a resourceVersion."""
        path = resource.path(namespace, name, subresource)
        return await self.retry.run(
            f"patch {path}",
            lambda: self._request("PATCH", path, body=patch, content_type=MERGE_PATCH),
            only_unprocessed=True,
        )

    async def replace(self, resource: Resource, namespace: str, name: str, body: Obj) -> Obj:
        """PUT the whole object. With `metadata.resourceVersion` in `body` this is compare-and-swap:
        409 `Conflict` when someone wrote in between. Retried only on 429, like a create."""
        path = resource.path(namespace, name)
        return await self.retry.run(
            f"replace {path}", lambda: self._request("PUT", path, body=body), only_unprocessed=True
        )

    async def review_token(self, token: str, audiences: Sequence[str]) -> Obj:
        """POST a TokenReview; the review's `status`. Safe to repeat (it stores nothing)."""
        body: Obj = {
            "apiVersion": TOKEN_REVIEWS.api_version,
            "kind": TOKEN_REVIEWS.kind,
            "spec": {"token": token, "audiences": list(audiences)},
        }
        path = TOKEN_REVIEWS.path("")
        review = await self.retry.run("token review", lambda: self._request("POST", path, body=body))
        status = review.get("status")
        return status if isinstance(status, dict) else {}

    # -- discovery ------------------------------------------------------------------------------

    async def sandbox_resource(self, namespace: str) -> Resource:
        """The Sandbox resource the cluster serves: v1beta1, else v1alpha1 — probed once, cached
        for the life of the process (restart the gateway after upgrading agent-sandbox)."""
        if self._sandbox_version is not None:
            return sandboxes(self._sandbox_version)
        async with self._probe_lock:
            if self._sandbox_version is None:
                self._sandbox_version = await self._probe(namespace)
                log.info("agent-sandbox Sandbox API: %s/%s", SANDBOX_GROUP, self._sandbox_version)
        return sandboxes(self._sandbox_version)

    async def _probe(self, namespace: str) -> str:
        for version in SANDBOX_VERSIONS:
            try:
                await self.list(sandboxes(version), namespace, limit=1)
            except NotFound:
                continue
            return version
        raise FailedPreconditionError(
            f"the cluster serves no {SANDBOX_GROUP} Sandbox API ({', '.join(SANDBOX_VERSIONS)}); install agent-sandbox"
        )

    # -- watch ----------------------------------------------------------------------------------

    async def watch(
        self,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        label_selector: str = "",
    ) -> AsyncGenerator[Obj, None]:
        """Watch events (`{"type", "object"}` dicts, bookmarks included) from `resource_version`
        until the server ends the stream (timeoutSeconds). Raises `Gone` on 410 — as an HTTP
        status or as an ERROR event — and `Temporary` when the connection drops or goes quiet."""
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", self._watch_timeout),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        path = resource.path(namespace)
        # No total deadline (the stream lives for timeoutSeconds), but a stream silent for longer
        # than that plus our timeout is dead: bookmarks and the server's own timeout break silence.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout, sock_read=self._watch_timeout + self._timeout
        )
        try:
            async with asyncio.timeout(self._timeout):
                response = await self._transport.send("GET", path, query=query, limits=timeout)
        except TimeoutError as exc:
            raise Temporary(0, "Timeout", f"watch {path}: no answer within {self._timeout}s") from exc
        except aiohttp.ClientError as exc:
            raise Temporary(0, "ConnectionError", f"watch {path}: {exc}") from exc
        try:
            if not 200 <= response.status < 300:
                raise error_for(response.status, await response.read(), response.headers)
            async for event in _events(response, path):
                yield event
        finally:
            response.release()


async def _events(response: Any, path: str) -> AsyncIterator[Obj]:
    try:
        async for line in response.content:
            if not line.strip():
                continue
            # orjson: half json's CPU on a pod's event (~3.5 KB), and a warm create brings ~30
            # events to the gateway's watches (pods 13, Sandboxes 10, claims 4, pools 3 on kubesim).
            event = orjson.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                code = int(status.get("code") or 500)
                raise error_for(code, json.dumps(status).encode())
            yield event
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        # A dropped or garbled stream: the caller resumes from the last version it saw.
        raise Temporary(0, "WatchDropped", f"watch {path}: {exc!r}") from exc
