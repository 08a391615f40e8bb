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

from aiohttp import web

from kubesim.apiserver import discovery, errors, routing, tokens, verbs
from kubesim.apiserver.auth import ANONYMOUS, Attributes, User
from kubesim.apiserver.handlers_common import error_response, json_response
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
        start = time.perf_counter()
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
            info = routing.parse(path)
            if info is None:
                verb = request.method.lower()
                resp = await self._non_resource(request, path, user)
            else:
                verb, resource, ns, name = self.verbs.describe(request, info)
                reason = self.server.authorizer.authorize(
                    Attributes(user, verb, info.group, info.resource, info.subresource, ns, name, path)
                )
                if reason is not None:
                    raise errors.forbidden(reason, resource=info.resource, group=info.group, name=name)
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
