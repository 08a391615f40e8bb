"""HTTP glue: one catch-all aiohttp handler that authenticates, routes, authorises, applies
injected faults, runs the verb and records the request.

Resource verbs live in ``verbs``; discovery in ``discovery``; this module only decides which to
call and turns results and ``ApiError``s into responses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from kubesim.apiserver import discovery, errors, openapi_proto, rbac, routing, selectors, tokens, verbs
from kubesim.apiserver.auth import ANONYMOUS, CURRENT_USER, Attributes, User
from kubesim.apiserver.handlers_common import Request, error_response, json_response
from kubesim.apiserver.requestlog import Entry

if TYPE_CHECKING:
    from kubesim.apiserver.server import ApiServer

log = logging.getLogger(__name__)
_PUBLIC = {"/version", "/healthz", "/livez", "/readyz"}


class Handler:
    """The aiohttp entry point for one ``ApiServer``."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.verbs = verbs.Verbs(server)

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        """Serve any request."""
        return await self.handle(request)

    async def handle(self, request: Request) -> web.StreamResponse:
        """Serve a request from HTTP or from a component in this process (resource paths only)."""
        start = time.perf_counter()
        current = None
        user = ANONYMOUS
        verb, resource, ns, name = "", "", "", ""
        code = 500
        try:
            found = self.server.authn.authenticate(request.headers.get("Authorization"))
            if found is None:
                raise errors.unauthorized()
            user = found
            path = request.path.rstrip("/") or "/"
            if user is ANONYMOUS and path not in _PUBLIC:
                raise errors.unauthorized()
            user = self._impersonate(request, user)
            # Request-local: reset below, as a request made in process runs in its caller's task.
            current = CURRENT_USER.set(user)
            info = routing.parse(path)
            if info is None and not isinstance(request, web.Request):
                raise errors.ApiError(404, "NotFound", "the server could not find the requested resource", details={})
            if info is None:
                assert isinstance(request, web.Request)
                verb = request.method.lower()
                # /_kubesim checks for the admin itself; every other path is a non-resource URL.
                if not path.startswith("/_kubesim"):
                    self._authorize(Attributes(user, verb, path=path))
                resp = await self._non_resource(request, path, user)
            else:
                verb, resource, ns, name = self.verbs.describe(request, info)
                self._authorize(_attributes(request, info, user, verb, ns, name, path))
                await self._faults(verb, resource, user)
                resp = await self.verbs.serve(request, info, verb, user)
            code = resp.status
            return resp
        except errors.ApiError as exc:
            code = exc.code
            return error_response(exc)
        except Exception as exc:  # a server bug: answer like a real server would, and log it
            log.exception("internal error serving %s %s", request.method, request.path_qs)
            return error_response(errors.internal(repr(exc)))
        finally:
            if current is not None:
                CURRENT_USER.reset(current)
            self.server.log.record(
                Entry(
                    time.time(),
                    user.username,
                    verb,
                    resource,
                    ns,
                    name,
                    code,
                    time.perf_counter() - start,
                    request.path,
                )
            )

    def _authorize(self, attrs: Attributes) -> None:
        """The one authorization decision of a request (or of one impersonation step): 403 if denied."""
        reason = self.server.authorizer.authorize(attrs)
        if reason is None:
            return
        message = rbac.forbidden_message(attrs, reason)
        if attrs.resource:
            raise errors.forbidden(message, resource=attrs.resource, group=attrs.group, name=attrs.name)
        raise errors.ApiError(403, "Forbidden", message, details={})

    def _impersonate(self, request: Request, user: User) -> User:
        """Act as the user named by ``Impersonate-*`` headers (``kubectl --as``), as the real
        impersonation filter does: each header is authorised as the verb ``impersonate``."""
        headers = request.headers
        name = headers.get("Impersonate-User")
        groups = list(headers.getall("Impersonate-Group", []))
        uid = headers.get("Impersonate-Uid", "")
        extra: dict[str, list[str]] = {}
        for key in headers:
            if key.lower().startswith("impersonate-extra-"):
                extra.setdefault(unquote(key[len("impersonate-extra-") :]).lower(), []).extend(headers.getall(key))
        if name is None:
            if groups or extra or uid:
                raise errors.bad_request(
                    f"requested {groups + [f'{k}={v}' for k, vs in extra.items() for v in vs]} "
                    "without impersonating a user"
                )
            return user
        explicit_groups = bool(groups)
        if name.startswith(rbac.SA_PREFIX) and name.count(":") == 3:
            sa_ns, sa_name = name[len(rbac.SA_PREFIX) :].split(":")
            self._authorize(Attributes(user, "impersonate", "", "serviceaccounts", "", sa_ns, sa_name))
            if not explicit_groups:
                groups = ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}"]
        else:
            self._authorize(Attributes(user, "impersonate", "", "users", name=name))
        for group in headers.getall("Impersonate-Group", []):
            self._authorize(Attributes(user, "impersonate", "", "groups", name=group))
        for key, values in extra.items():
            for value in values:
                self._authorize(Attributes(user, "impersonate", "authentication.k8s.io", "userextras", key, name=value))
        if uid:
            self._authorize(Attributes(user, "impersonate", "authentication.k8s.io", "uids", name=uid))
        if name != ANONYMOUS.username and not {"system:authenticated", "system:unauthenticated"} & set(groups):
            groups.append("system:authenticated")
        return User(name, tuple(groups), uid, extra)

    async def _faults(self, verb: str, resource: str, user: User) -> None:
        faults = self.server.faults
        delay = faults.delay_for(verb, resource, user.username)
        if delay > 0:
            await asyncio.sleep(delay)
        faults.check(verb, resource, user.username)

    async def _non_resource(self, request: web.Request, path: str, user: User) -> web.StreamResponse:
        registry = self.server.registry
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return json_response(discovery.VERSION)
        if path == "/.well-known/openid-configuration":
            return json_response(tokens.OIDC_DISCOVERY)
        if path == "/openid/v1/jwks":
            return json_response(self.server.issuer.jwks(), content_type="application/jwk-set+json")
        if path.startswith("/_kubesim"):
            return await self.server.admin.serve(request, path, user)
        if request.method != "GET":
            raise errors.method_not_allowed()
        if path == "/openapi" or path.startswith("/openapi/"):
            return self._openapi(request, path)
        aggregated = discovery.wants_aggregated(request.headers.get("Accept", ""))
        if path in ("/api", "/apis"):
            core = path == "/api"
            if aggregated:
                return json_response(
                    discovery.aggregated(registry, core=core), content_type=discovery.AGGREGATED_CONTENT_TYPE
                )
            if core:
                return json_response(discovery.api_versions(f"127.0.0.1:{self.server.port}"))
            return json_response(discovery.api_groups(registry))
        parts = path.strip("/").split("/")
        body: dict[str, Any] | None = None
        if parts[0] == "api" and len(parts) == 2:
            body = discovery.resource_list(registry, "", parts[1])
        elif parts[0] == "apis" and len(parts) == 2:
            body = discovery.api_group(registry, parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            body = discovery.resource_list(registry, parts[1], parts[2])
        if body is None:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource", details={})
        return json_response(body)

    def _openapi(self, request: web.Request, path: str) -> web.StreamResponse:
        docs = self.server.openapi
        if path == "/openapi/v2":
            document = docs.v2_document()
            if openapi_proto.CONTENT_TYPE in request.headers.get("Accept", ""):
                return web.Response(body=openapi_proto.encode(document), content_type=openapi_proto.CONTENT_TYPE)
            return json_response(document)
        if path == "/openapi/v3":
            # The index changes when CRDs do: never cached (the documents it links are, by hash).
            return json_response(docs.v3_index(), headers={"Cache-Control": "no-cache, private"})
        found = docs.v3_document(path[len("/openapi/v3/") :]) if path.startswith("/openapi/v3/") else None
        if found is None:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource", details={})
        body, digest = found
        cache = "public, immutable" if request.query.get("hash") == digest else "no-cache, private"
        return json_response(body, headers={"Cache-Control": cache, "Etag": f'"{digest}"'})


def _attributes(
    request: Request, info: routing.RequestInfo, user: User, verb: str, ns: str, name: str, path: str
) -> Attributes:
    """What RBAC sees of a resource request, with upstream's two twists: a list or watch pinned to
    one name by ``fieldSelector=metadata.name=X`` is about X (so a rule with ``resourceNames`` can
    allow it), and a request for a namespace object is "in" that namespace."""
    if not name and verb in ("list", "watch"):
        name = selectors.exact_name(request.query.get("fieldSelector")) or ""
    if info.resource == "namespaces" and info.name and not info.group:
        ns = info.name
    return Attributes(user, verb, info.group, info.resource, info.subresource, ns, name, path)
