"""``/_kubesim/*``: request counters and fault injection over HTTP, for a server in another process.

Only the admin token may use it. ``GET /_kubesim/requests`` returns counters (``?user=`` filters),
``DELETE`` resets them; ``POST /_kubesim/faults`` takes one JSON action:
``{"action": "latency", "seconds": 0.05, "verb": "create", "resource": "pods", "user": "..."}``,
``{"action": "fail", "count": 2, "code": 429, "retryAfter": 1, ...}``, ``{"action": "closeWatches"}``,
``{"action": "compact"}``, ``{"action": "unavailable", "seconds": 2}`` (503s),
``{"action": "offline", "seconds": 2}`` (connections refused), ``{"action": "clear"}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubesim.apiserver import errors
from kubesim.apiserver.auth import User
from kubesim.apiserver.handlers_common import decode_body, json_response

if TYPE_CHECKING:
    from kubesim.apiserver.server import ApiServer


class Admin:
    """Serves the admin endpoints of one server."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def serve(self, request: web.Request, path: str, user: User) -> web.StreamResponse:
        """Dispatch an admin request."""
        if user.username != self.server.config.admin_username:
            raise errors.forbidden("only the kubesim admin may use /_kubesim")
        if path == "/_kubesim/requests":
            if request.method == "DELETE":
                self.server.log.clear()
                return json_response({"status": "Success"})
            rows = self.server.log.snapshot()
            who = request.query.get("user")
            if who:
                rows = [r for r in rows if r["user"] == who]
            return json_response({"counters": rows})
        if path == "/_kubesim/faults" and request.method == "POST":
            body = decode_body(await request.read(), request.headers.get("Content-Type", "")) or {}
            await self.apply(body)
            return json_response({"status": "Success"})
        raise errors.ApiError(404, "NotFound", "the server could not find the requested resource", details={})

    async def apply(self, body: dict[str, Any]) -> None:
        """Apply one fault action (see module docstring)."""
        faults = self.server.faults
        action = body.get("action")
        match = {k: body.get(k) for k in ("verb", "resource", "user")}
        if action == "latency":
            faults.add_latency(float(body["seconds"]), **match)
        elif action == "fail":
            faults.fail_next(
                int(body.get("count", 1)), code=int(body.get("code", 500)), retry_after=body.get("retryAfter"), **match
            )
        elif action == "closeWatches":
            self.server.close_watches(body.get("resource"))
        elif action == "compact":
            self.server.compact()
        elif action == "unavailable":
            faults.make_unavailable(float(body["seconds"]))
        elif action == "offline":
            await self.server.go_offline(float(body["seconds"]))
        elif action == "clear":
            faults.clear()
        else:
            raise errors.bad_request(f"unknown fault action {action!r}")
