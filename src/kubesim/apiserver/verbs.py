"""Resource verbs over HTTP: get, list, watch, create, update, patch, delete, deletecollection
and the subresources (status, scale, token, binding)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubesim.apiserver import deletion, errors, params, reviews, scaling, selectors, special, tables, watch
from kubesim.apiserver.auth import User
from kubesim.apiserver.handlers_common import Request, decode_body, json_response
from kubesim.apiserver.localrequest import LocalRequest, OpenedWatch
from kubesim.apiserver.resources import VIRTUAL, ResourceType
from kubesim.apiserver.rest import Result, WriteOptions
from kubesim.apiserver.routing import RequestInfo
from kubesim.apiserver.store import Stored
from kubesim.apiserver.watch import Watcher
from kubesim.jsonwire import copy_of, dumps

if TYPE_CHECKING:
    from kubesim.apiserver.server import ApiServer

_NOT_FOUND = "the server could not find the requested resource"
_CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may show "
    "up in the list."
)


def _missing() -> errors.ApiError:
    return errors.ApiError(404, "NotFound", _NOT_FOUND, details={})


class Verbs:
    """Serves resource requests for one server."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.rest = server.rest

    # ---- classification ----------------------------------------------------------------------

    def resource_type(self, info: RequestInfo) -> ResourceType:
        """The served resource or 404; checks namespace scoping and known subresources."""
        rt = self.server.registry.lookup(info.group, info.version, info.resource)
        if rt is None:
            raise _missing()
        if info.namespace is not None and not rt.namespaced:
            raise _missing()
        if info.subresource and info.subresource not in rt.subresources:
            raise _missing()
        return rt

    def describe(self, request: Request, info: RequestInfo) -> tuple[str, str, str, str]:
        """(verb, resource label, namespace, name) as RBAC and the request log see them."""
        rt = self.resource_type(info)
        method = request.method
        watching = info.watch_prefix or params.boolean(request.query, "watch")
        if method == "GET":
            # A watch may name one object (``/watch/.../name`` or ``.../name?watch=true``).
            verb = "watch" if watching else ("get" if info.name else "list")
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if info.name else "deletecollection"
        else:
            raise errors.method_not_allowed()
        if method in ("PUT", "PATCH") and not info.name:
            raise errors.method_not_allowed()
        if verb not in rt.verbs and not info.subresource:
            raise errors.method_not_allowed()
        label = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
        if info.subresource:
            label += "/" + info.subresource
        return verb, label, info.namespace or "", info.name

    # ---- dispatch ----------------------------------------------------------------------------

    async def serve(self, request: Request, info: RequestInfo, verb: str, user: User) -> web.StreamResponse:
        """Run the verb."""
        rt = self.resource_type(info)
        ns = info.namespace or ""
        if rt.namespaced and info.name and info.namespace is None and rt.plural != "namespaces":
            raise _missing()
        if verb == "list":
            return self.list(request, rt, info)
        if verb == "watch":
            return await self.watch(request, rt, info, user)
        if verb == "get":
            return self.get(request, rt, info)
        raw = await request.read()
        q = request.query
        opts = WriteOptions(
            dry_run="All" in q.getall("dryRun", []),
            field_validation=q.get("fieldValidation", "Warn") or "Warn",
            manager=q.get("fieldManager", ""),
            force=params.boolean(q, "force"),
        )
        if opts.field_validation not in ("Strict", "Warn", "Ignore"):
            raise errors.bad_request(f"fieldValidation parameter unsupported: {opts.field_validation}")
        if verb == "create":
            return self.create(request, rt, info, raw, opts, user)
        if verb == "update":
            body = _decoded(request, raw)
            if info.subresource == "scale":
                stored = self.rest.get(rt, ns, info.name)
                return self.reply(request, scaling.update_scale(self.rest, rt, info.version, stored, body, opts))
            if info.subresource not in ("", "status", "finalize"):
                raise errors.method_not_allowed()
            sub = "" if info.subresource == "finalize" else info.subresource
            return self.reply(request, self.rest.update(rt, info.version, ns, info.name, body, opts, subresource=sub))
        if verb == "patch":
            if info.subresource not in ("", "status", "scale"):
                raise errors.method_not_allowed()
            ct, sub = _content_type(request), info.subresource
            if isinstance(request, LocalRequest) and request.payload is not None:
                written = self.rest.patch_decoded(rt, info.version, ns, info.name, ct, request.payload, opts, sub)
            else:
                written = self.rest.patch(rt, info.version, ns, info.name, ct, raw, opts, subresource=sub)
            return self.reply(request, written)
        body = _decoded(request, raw) if raw or isinstance(request, LocalRequest) else None
        dopts = deletion.DeleteOptions.parse(body, dict(q), opts.dry_run)
        if verb == "delete":
            return self.reply(request, deletion.delete(self.rest, rt, info.version, ns, info.name, dopts))
        matching = self._select(request, rt, info.namespace)
        deleted = deletion.delete_collection(self.rest, rt, info.version, info.namespace, matching, dopts)
        return self.reply(request, deleted)

    def reply(self, request: Request, result: Result) -> web.Response:
        """Encode a write result, with Warning headers as the real server sends them; a component
        in this process gets its own copy of the object instead (no warnings: nobody reads them)."""
        if isinstance(request, LocalRequest):
            if result.stored is None:
                request.answer = copy_of(result.obj)
            elif request.read_only_answer:
                request.answer = result.stored.view(result.obj["apiVersion"])
            else:
                request.answer = result.stored.copy(result.obj["apiVersion"])
            return web.Response(status=result.code)
        resp = json_response(result.obj, result.code)
        for w in result.warnings:
            resp.headers.add("Warning", f'299 - "{w}"')
        return resp

    # ---- reads -------------------------------------------------------------------------------

    def get(self, request: Request, rt: ResourceType, info: RequestInfo) -> web.Response:
        """GET one object (or its status/scale view)."""
        stored = self.rest.get(rt, info.namespace or "", info.name)
        if info.subresource == "scale":
            return json_response(scaling.scale_of(rt, stored))
        if info.subresource not in ("", "status"):
            raise errors.method_not_allowed()
        printer = self._printer(request, rt, info.version)
        if printer is not None:
            columns, cells = printer
            include = request.query.get("includeObject", "Metadata")
            meta = {"resourceVersion": stored.obj["metadata"]["resourceVersion"]}
            return json_response(tables.table(columns, [tables.row(stored.obj, cells(stored.obj), include)], meta))
        if isinstance(request, LocalRequest):
            request.answer = stored.copy(rt.api_version(info.version))
            return web.Response(status=200)
        return json_response(stored.encoded(rt.api_version(info.version)))

    def _printer(self, request: Request, rt: ResourceType, version: str) -> tuple[Any, tables.Row] | None:
        if not tables.wants_table(request.headers.get("Accept", "")):
            return None
        return tables.printer(rt, version)

    def _table_renderer(
        self, request: Request, rt: ResourceType, version: str
    ) -> Callable[[str, Stored], bytes] | None:
        printer = self._printer(request, rt, version)
        if printer is None:
            return None
        columns, cells = printer
        include = request.query.get("includeObject", "Metadata")

        def render(kind: str, stored: Stored) -> bytes:
            meta = {"resourceVersion": stored.obj["metadata"]["resourceVersion"]}
            obj = tables.table(columns, [tables.row(stored.obj, cells(stored.obj), include)], meta)
            return b'{"type":"' + kind.encode() + b'","object":' + dumps(obj) + b"}\n"

        return render

    def _predicate(self, request: Request, rt: ResourceType, name: str = "") -> selectors.Predicate | None:
        q = request.query
        by_name = selectors.field_selector(f"metadata.name={name}") if name else None
        return selectors.combine(
            selectors.label_selector(q.get("labelSelector")),
            selectors.field_selector(q.get("fieldSelector"), custom=rt.custom),
            by_name,
        )

    def _select(
        self,
        request: Request,
        rt: ResourceType,
        ns: str | None,
        objects: dict[tuple[str, str], Stored] | None = None,
    ) -> list[Stored]:
        pred = self._predicate(request, rt)
        name = selectors.exact_name(request.query.get("fieldSelector"))
        if objects is not None:
            scope = ns if rt.namespaced else None
            candidates = [objects[k] for k in sorted(objects) if scope is None or k[0] == scope]
        elif name is not None and ns is not None:
            found = self.server.store.get(rt.group, rt.plural, ns if rt.namespaced else "", name)
            candidates = [found] if found is not None else []
        else:
            candidates = list(self.server.store.iter(rt.group, rt.plural, ns if rt.namespaced else None))
        if pred is None:
            return candidates
        return [s for s in candidates if pred(s.obj)]

    def list(self, request: Request, rt: ResourceType, info: RequestInfo) -> web.Response:
        """GET a collection: selectors, limit/continue, resourceVersion semantics."""
        q = request.query
        store = self.server.store
        rv = params.resource_version(q.get("resourceVersion"))
        match = q.get("resourceVersionMatch", "")
        if rv is not None and rv > store.rv:
            raise errors.ApiError(
                504,
                "Timeout",
                f"Too large resource version: {rv}, current: {store.rv}",
                details={
                    "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    "retryAfterSeconds": 1,
                },
            )
        if match and rv is None:
            raise errors.ApiError(
                422,
                "Invalid",
                'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            )
        if q.get("continue") and rv is not None and rv != 0:
            raise errors.bad_request("specifying resource version is not allowed when using continue")
        # Exact lists and continued lists are served from the state at their resourceVersion.
        at: int | None = rv if match == "Exact" and rv is not None else None
        token = q.get("continue")
        start: tuple[str, str] | None = None
        if token:
            at, start = params.decode_continue(token)
        objects = store.snapshot(rt.group, rt.plural, at) if at is not None else None
        if at is not None and objects is None:
            if token:
                raise errors.gone(_CONTINUE_TOO_OLD)
            raise errors.gone(f"too old resource version: {at} ({store.oldest(rt.group, rt.plural) + 1})")
        items = self._select(request, rt, info.namespace, objects)
        if start is not None:
            items = [s for s in items if _key(s) > start]
        list_rv = at if at is not None else store.rv
        limit = params.integer(q, "limit")
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if limit and limit > 0 and len(items) > limit:
            last = items[limit - 1]
            meta["continue"] = params.encode_continue(list_rv, *_key(last))
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        av = rt.api_version(info.version)
        printer = self._printer(request, rt, info.version)
        if printer is not None:
            columns, cells = printer
            include = q.get("includeObject", "Metadata")
            rows = [tables.row(s.obj, cells(s.obj), include) for s in items]
            return json_response(tables.table(columns, rows, meta))
        head = dumps({"kind": rt.list_kind, "apiVersion": av, "metadata": meta})[:-1]
        body = head + b',"items":[' + b",".join(s.encoded(av) for s in items) + b"]}"
        return json_response(body)

    async def watch(self, request: Request, rt: ResourceType, info: RequestInfo, user: User) -> web.StreamResponse:
        """A watch stream: replay from a resourceVersion, or initial ADDED events, then live events."""
        q = request.query
        store = self.server.store
        cfg = self.server.config
        rv_raw = q.get("resourceVersion")
        since = params.resource_version(rv_raw)
        send_initial = q.get("sendInitialEvents")
        initial = params.boolean(q, "sendInitialEvents") if send_initial is not None else since in (None, 0)
        bookmarks = params.boolean(q, "allowWatchBookmarks")
        if send_initial is not None and initial and (not bookmarks or q.get("resourceVersionMatch") != "NotOlderThan"):
            raise errors.ApiError(
                422,
                "Invalid",
                'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is '
                "forbidden for watch unless the WatchList feature gate is enabled and resourceVersionMatch "
                "is NotOlderThan and allowWatchBookmarks is true",
            )
        timeout = params.integer(q, "timeoutSeconds")
        timeout_s = float(timeout) if timeout is not None and timeout > 0 else cfg.watch_timeout
        av = rt.api_version(info.version)
        local = isinstance(request, LocalRequest)
        w = (watch.ObjectWatcher if local else watch.Watcher)(
            namespace=info.namespace if rt.namespaced else None,
            predicate=self._predicate(request, rt, info.name),
            api_version=av,
            user=user.username,
            after=since or 0,
            render=None if local else self._table_renderer(request, rt, info.version),
        )
        bucket = store.bucket(rt.group, rt.plural)
        # Snapshot and subscription happen with no await in between, so no event can slip through.
        self._prime(request, rt, info, w, since=since, initial=initial, sent_initial=send_initial is not None)
        bucket.subscribers.add(w)
        if isinstance(request, LocalRequest):
            assert isinstance(w, watch.ObjectWatcher)
            request.opened = OpenedWatch(w, bucket, timeout_s)  # its consumer reads and unsubscribes it
            return web.Response(status=200)
        assert isinstance(request, web.Request)
        try:
            return await watch.stream(
                request,
                w,
                store=store,
                kind=rt.kind,
                api_version=av,
                duration=timeout_s,
                bookmarks=bookmarks,
                bookmark_interval=cfg.bookmark_interval,
            )
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        finally:
            bucket.subscribers.discard(w)

    def _prime(
        self,
        request: Request,
        rt: ResourceType,
        info: RequestInfo,
        w: Watcher,
        *,
        since: int | None,
        initial: bool,
        sent_initial: bool,
    ) -> None:
        """Queue what a new watch sees before live events: the current objects as ADDED (then the
        initial-events bookmark when asked for), or the retained events after ``since`` (or 410)."""
        store = self.server.store
        if initial:
            for s in self._select(request, rt, info.namespace):
                if info.name and s.obj["metadata"]["name"] != info.name:
                    continue
                w.added(s)
            if sent_initial:
                w.push(watch.bookmark(rt.kind, rt.api_version(info.version), store.rv, initial_end=True))
        elif since is not None:
            events = store.replay(rt.group, rt.plural, since)
            if events is None:
                w.close(watch.expired_status(since, store.oldest(rt.group, rt.plural)))
            else:
                for event in events:
                    w.offer(event)

    # ---- create and computed verbs -----------------------------------------------------------

    def _review(self, rt: ResourceType, body: Any, user: User) -> dict[str, Any]:
        if rt.plural == "tokenreviews":
            return special.token_review(self.server.authn, body)
        if rt.plural == "selfsubjectreviews":
            return reviews.self_subject_review(user)
        if rt.plural == "selfsubjectrulesreviews":
            return reviews.self_subject_rules_review(self.server.authorizer, body, user)
        return reviews.access_review(self.server.authorizer, body, user, self_review=rt.plural.startswith("self"))

    def create(
        self, request: Request, rt: ResourceType, info: RequestInfo, raw: bytes, opts: WriteOptions, user: User
    ) -> web.Response:
        """POST to a collection or to the token/binding subresources."""
        body = _decoded(request, raw)
        ns = info.namespace or ""
        if info.subresource == "token":
            obj = special.token_request(
                self.rest, self.server.issuer, self.server.config.api_audiences, ns, info.name, body
            )
            return json_response(obj, 201)
        if info.subresource == "binding":
            return json_response(special.bind(self.rest, ns, info.name, body), 201)
        if info.name or info.subresource:
            raise errors.method_not_allowed()
        if rt.key in VIRTUAL:
            return json_response(self._review(rt, body, user), 201)
        if rt.namespaced and info.namespace is None:
            raise errors.method_not_allowed()
        return self.reply(request, self.rest.create(rt, info.version, ns, body, opts))


def _key(s: Stored) -> tuple[str, str]:
    m = s.obj["metadata"]
    return (m.get("namespace", ""), m["name"])


def _decoded(request: Request, raw: bytes) -> Any:
    """The request's body: a component in this process hands it over as an object."""
    if isinstance(request, LocalRequest) and request.payload is not None:
        return request.payload
    return decode_body(raw, _content_type(request))


def _content_type(request: Request) -> str:
    # The raw header: aiohttp reports a missing one as application/octet-stream, but the real
    # server treats a missing Content-Type as JSON (the official sync client sends none).
    return request.headers.get("Content-Type", "").split(";")[0].strip()
