"""The write path shared by every resource: create, update, patch and their subresources.

This is the simulator's version of the generic registry store plus the per-kind strategies:
metadata is owned by the server, status is split off when a status subresource exists,
``generation`` moves only on spec changes, optimistic concurrency is enforced, no-op writes do not
bump the resourceVersion, and CRD objects register the resources they define.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from kubesim import jsonwire
from kubesim.apiserver import (
    applying,
    builtin_schemas,
    builtins,
    cel,
    crds,
    errors,
    meta,
    patching,
    rbac_objects,
    scaling,
)
from kubesim.apiserver.resources import Registry, ResourceType
from kubesim.apiserver.schema import FieldError, Schema
from kubesim.apiserver.store import Store, Stored

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE, JSON_PATCH, STRATEGIC, APPLY)
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


@dataclass
class WriteOptions:
    """Query options common to writes."""

    dry_run: bool = False
    field_validation: str = "Warn"  # Strict | Warn | Ignore
    manager: str = ""
    force: bool = False


@dataclass
class Result:
    """A write's answer: the object (as served), the HTTP code and any warnings."""

    obj: dict[str, Any]
    code: int = 200
    warnings: list[str] = field(default_factory=list)
    #: The stored version ``obj`` shows, when it is one (its cached encoding makes copies cheap).
    stored: Stored | None = None


def _strip_volatile(obj: dict[str, Any]) -> dict[str, Any]:
    # Only timestamps of managedFields entries are ignored: a change of ownership is a real write.
    m = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")}
    managed = obj.get("metadata", {}).get("managedFields")
    if managed:
        m["managedFields"] = [{k: v for k, v in e.items() if k != "time"} for e in managed]
    return {**obj, "metadata": m}


def _spec_part(obj: dict[str, Any], has_status: bool) -> dict[str, Any]:
    drop = ("metadata", "status") if has_status else ("metadata",)
    return {k: v for k, v in obj.items() if k not in drop}


# A last check on a write that passed validation: (resource, new object, current or None). It
# raises an ApiError to refuse the write (RBAC's escalation prevention is one).
Admission = Callable[[ResourceType, dict[str, Any], Stored | None], None]


class Rest:
    """Resource semantics over the store; synchronous so internal controllers can call it too."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.admission: list[Admission] = []
        #: Per resource and version: the schema, the encoded ``spec`` of the last create it
        #: admitted with nothing pruned and no error, and that spec as admitted (defaults set).
        self._admitted_specs: dict[tuple[tuple[str, str], str], tuple[object, bytes, bytes]] = {}

    # ---- reads -------------------------------------------------------------------------------

    def get(self, rt: ResourceType, ns: str, name: str) -> Stored:
        """The stored object or 404."""
        found = self.store.get(rt.group, rt.plural, ns if rt.namespaced else "", name)
        if found is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return found

    # ---- create ------------------------------------------------------------------------------

    def check_namespace(self, rt: ResourceType, ns: str, name: str) -> None:
        """Creates need an existing namespace that is not terminating."""
        if not rt.namespaced:
            return
        found = self.store.get("", "namespaces", "", ns)
        if found is None:
            raise errors.not_found("namespaces", "", ns)
        if found.obj["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                f'{errors.qualified(rt.plural, rt.group)} "{name}" is forbidden: '
                f"unable to create new content in namespace {ns} because it is being terminated",
                resource=rt.plural,
                group=rt.group,
            )

    def create(self, rt: ResourceType, version: str, ns: str, body: Any, opts: WriteOptions) -> Result:
        """POST: name or generateName, server-owned metadata, 201."""
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        obj = body
        m = meta.metadata(obj)
        if rt.namespaced:
            if m.get("namespace") and m["namespace"] != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            m["namespace"] = ns
            self.check_namespace(rt, ns, m.get("name") or m.get("generateName", ""))
        else:
            m.pop("namespace", None)
        if not m.get("name"):
            if m.get("generateName"):
                m["name"] = meta.generate_name(m["generateName"])
            else:
                raise errors.invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        {
                            "field": "metadata.name",
                            "reason": "FieldValueRequired",
                            "message": "Required value: name or generateName is required",
                        }
                    ],
                )
        if self.store.get(rt.group, rt.plural, m.get("namespace", ""), m["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, m["name"])
        for key in (*_SERVER_META, "resourceVersion", "selfLink"):
            m.pop(key, None)
        m["uid"] = meta.new_uid()
        m["creationTimestamp"] = meta.now()
        m["generation"] = 1
        if rt.has_status and rt.custom:
            obj.pop("status", None)
        return self._commit(rt, version, obj, None, opts, code=201)

    # ---- update / patch ----------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        body: Any,
        opts: WriteOptions,
        *,
        subresource: str = "",
        is_patch: bool = False,
    ) -> Result:
        """PUT (and the tail of PATCH): optimistic concurrency, subresource masking."""
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        cur = self.get(rt, ns, name)
        m = meta.metadata(body)
        if m.get("name") and m["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({m['name']}) does not match the name on the URL ({name})"
            )
        rv = m.get("resourceVersion")
        if rv and rv != cur.obj["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name, errors.STALE_OBJECT)
        if not rv and not is_patch and rt.custom:
            raise errors.invalid(
                rt.kind,
                rt.group,
                name,
                [
                    {
                        "field": "metadata.resourceVersion",
                        "reason": "FieldValueInvalid",
                        "message": "Invalid value: 0x0: must be specified for an update",
                    }
                ],
            )
        return self._commit(rt, version, body, cur, opts, subresource=subresource)

    def patch(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        content_type: str,
        raw: bytes,
        opts: WriteOptions,
        *,
        subresource: str = "",
    ) -> Result:
        """PATCH with any of the four patch types; apply creates when the object is missing."""
        _check_patch_type(rt, content_type)
        try:
            body = yaml.safe_load(raw) if content_type == APPLY else _json(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"error decoding patch: {exc}") from exc
        return self.patch_decoded(rt, version, ns, name, content_type, body, opts, subresource)

    def patch_decoded(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        content_type: str,
        body: Any,
        opts: WriteOptions,
        subresource: str = "",
    ) -> Result:
        """PATCH with the patch already decoded (a private object: the result may keep parts of it)."""
        _check_patch_type(rt, content_type)
        av = rt.api_version(version)
        found = self.store.get(rt.group, rt.plural, ns if rt.namespaced else "", name)
        if found is None:
            if content_type == APPLY and not subresource:
                return self._apply_create(rt, version, ns, name, body, opts)
            raise errors.not_found(rt.plural, rt.group, name)
        if subresource == "scale":
            return scaling.patch_scale(self, rt, version, found, content_type, body, opts)
        # A merge patch of the status takes only the status from its result (`_carry_over`), and
        # `merge_patch` builds new dicts along the patch and never edits its target: it can merge
        # onto the stored object itself, where a private copy meant decoding the whole object
        # (a pod with its template) on each of ~11 status writes per warm claim.
        base = found.view(av) if content_type == MERGE and subresource == "status" else found.copy(av)
        if content_type == MERGE:
            if not isinstance(body, dict):
                raise errors.bad_request("merge patch must be a JSON object")
            new = patching.merge_patch(base, body)
        elif content_type == JSON_PATCH:
            new = patching.json_patch(base, body)
        elif content_type == STRATEGIC:
            new = patching.strategic_merge(base, body)
        else:
            new = self._apply_body(rt, av, name, base, body, opts)
        if not isinstance(new, dict):
            raise errors.bad_request("patch produced a non-object")
        m = meta.metadata(new)
        rv = m.get("resourceVersion")
        if rv != found.obj["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name, errors.STALE_OBJECT)
        return self.update(rt, version, ns, name, new, opts, subresource=subresource, is_patch=True)

    def _apply_body(
        self, rt: ResourceType, av: str, name: str, live: dict[str, Any] | None, body: Any, opts: WriteOptions
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("apply patch must be an object")
        if body.get("apiVersion") != av or body.get("kind") != rt.kind:
            raise errors.bad_request(
                f"apply patch apiVersion/kind ({body.get('apiVersion')}/{body.get('kind')}) "
                f"do not match the request ({av}/{rt.kind})"
            )
        if (body.get("metadata") or {}).get("name", name) != name:
            raise errors.bad_request("the name of the object does not match the name on the URL")
        return applying.apply(live, body, manager=opts.manager, force=opts.force, api_version=av)

    def _apply_create(
        self, rt: ResourceType, version: str, ns: str, name: str, body: Any, opts: WriteOptions
    ) -> Result:
        obj = self._apply_body(rt, rt.api_version(version), name, None, body, opts)
        meta.metadata(obj)["name"] = name
        return self.create(rt, version, ns, obj, opts)

    # ---- the commit --------------------------------------------------------------------------

    def _commit(
        self,
        rt: ResourceType,
        version: str,
        new: dict[str, Any],
        old: Stored | None,
        opts: WriteOptions,
        *,
        subresource: str = "",
        code: int = 200,
    ) -> Result:
        av = rt.api_version(version)
        if new.get("kind") not in (None, rt.kind):
            raise errors.bad_request(
                f"the kind in the body ({new.get('kind')}) does not match the resource ({rt.kind})"
            )
        if new.get("apiVersion") not in (None, av):
            raise errors.bad_request(
                f"the API version in the data ({new.get('apiVersion')}) does not match the expected API version ({av})"
            )
        new["apiVersion"] = rt.api_version()
        new["kind"] = rt.kind
        if old is not None:
            new = self._carry_over(rt, version, new, old, subresource)
        else:
            builtins.on_create(rt.group, rt.plural, new)
        warnings, admitted_by = self._validate(rt, version, new, old, opts)
        for admit in self.admission:
            admit(rt, new, old)
        if old is not None:
            om = old.obj["metadata"]
            m = new["metadata"]
            if _spec_part(new, rt.has_status) != _spec_part(old.obj, rt.has_status):
                m["generation"] = om.get("generation", 1) + 1
            if _strip_volatile(new) == _strip_volatile(old.obj):
                return Result(old.view(av), 200, warnings, old)  # no-op: no new resourceVersion, no event
            if (
                m.get("deletionTimestamp")
                and not m.get("finalizers")
                and not m.get("deletionGracePeriodSeconds")
                and rt.key != ("", "namespaces")  # the namespace controller removes those
            ):
                if opts.dry_run:
                    return Result(new, 200, warnings)
                gone = self.store.delete(rt.group, rt.plural, old, new)
                self.after_delete(rt, gone)
                return Result(Stored(gone.obj).view(av), 200, warnings)
        served = None
        if rt.key == CRD_KEY:
            new["status"] = crds.established_status(new, old.obj if old else None)
            served = self._compile_crd(new)
        if opts.dry_run:
            return Result(new if av == new["apiVersion"] else {**new, "apiVersion": av}, code, warnings)
        new["metadata"]["resourceVersion"] = str(self.store.next_rv())
        stored = self.store.put(rt.group, rt.plural, new, old)
        stored.admitted_by = admitted_by
        if served is not None:
            self.registry.add(served)
        return Result(stored.view(av), code, warnings, stored)

    def _compile_crd(self, crd: dict[str, Any]) -> ResourceType:
        # Compile before storing, so a schema we cannot use is a 422 and not a half-registered CRD.
        try:
            return crds.to_resource(crd)
        except (re.error, KeyError, TypeError, ValueError, cel.CelError) as exc:
            cause = {
                "field": "spec.versions",
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "object": {exc}',
            }
            raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", _name(crd), [cause]) from exc

    def _carry_over(
        self, rt: ResourceType, version: str, new: dict[str, Any], old: Stored, subresource: str
    ) -> dict[str, Any]:
        om = old.obj["metadata"]
        if subresource == "status":
            status = new.get("status")
            managed = new.get("metadata", {}).get("managedFields")
            admitter = self._admitter(rt, version)
            if admitter is None or _same_admitter(admitter, old.admitted_by):
                # The walk that follows skips every value equal to the stored version's (ratcheting),
                # so what a status write leaves as it was can stay the stored object's own: only the
                # top level and the metadata, which the commit edits, are the write's. A full copy
                # meant decoding the whole object (a pod with its template) on every status write.
                new = {**old.obj, "metadata": {**om}}
            else:
                new = old.copy()
                # A merge patch's result shares its unpatched values with the stored status.
                status = jsonwire.copy_of(status)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            if managed is not None:
                new["metadata"]["managedFields"] = managed
            return new
        m = new["metadata"]
        for key in (*_SERVER_META, "name", "namespace"):
            if key in om:
                m[key] = om[key]
            else:
                m.pop(key, None)
        m["resourceVersion"] = om["resourceVersion"]
        if rt.has_status:
            if "status" in old.obj:
                new["status"] = jsonwire.copy_of(old.obj["status"])
            else:
                new.pop("status", None)
        if om.get("deletionTimestamp"):
            added = [f for f in m.get("finalizers") or [] if f not in (om.get("finalizers") or [])]
            if added:
                raise errors.invalid(
                    rt.kind,
                    rt.group,
                    om["name"],
                    [
                        {
                            "field": "metadata.finalizers",
                            "reason": "FieldValueForbidden",
                            "message": "Forbidden: no new finalizers can be added if the object "
                            f"is being deleted, found new finalizers {added}",
                        }
                    ],
                )
        builtins.on_update(rt.group, rt.plural, new)
        return new

    def _validate(
        self, rt: ResourceType, version: str, new: dict[str, Any], old: Stored | None, opts: WriteOptions
    ) -> tuple[list[str], object]:
        """Prune, default and validate ``new``; its warnings, and the schema that admitted it."""
        name = new["metadata"].get("name", "")
        causes: list[FieldError] = []
        warnings: list[str] = []
        if rt.group == rbac_objects.GROUP:
            # RBAC names are path segments ("system:discovery"), not DNS names.
            name_errors = rbac_objects.name_errors(name)
        else:
            name_errors = meta.name_errors(name, label=rt.plural == "namespaces")
        for message in name_errors:
            causes.append(
                {
                    "field": "metadata.name",
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "{name}": {message}',
                }
            )
        causes.extend(meta.metadata_errors(new["metadata"], old.obj["metadata"] if old is not None else None))
        pruned: list[str] = []
        admitted_by = self._admitter(rt, version)
        spec = _SpecMemo(self._admitted_specs, (rt.key, version), new) if old is None else None
        old_admitted = old is not None and _same_admitter(old.admitted_by, admitted_by)
        if isinstance(admitted_by, Schema):
            if spec is not None and spec.admitted_by(admitted_by):
                errs, pruned = admitted_by.admit(new, spec.as_old(), old_admitted=True)
            else:
                errs, pruned = admitted_by.admit(new, old.obj if old is not None else None, old_admitted=old_admitted)
            causes.extend(errs)
            info = rt.versions[version]
            if info.deprecated:
                warnings.append(info.deprecation_warning)
        elif isinstance(admitted_by, str):
            # Built-in kinds decode into Go structs: fields they lack are dropped (or refused).
            unchanged_since = old.obj if old is not None and old_admitted else None
            if spec is not None and spec.admitted_by(admitted_by):
                unchanged_since = spec.as_old()
            pruned = builtin_schemas.prune_unknown(new, admitted_by, old=unchanged_since)
        if pruned and opts.field_validation == "Strict":
            unknown = ", ".join(f'unknown field "{p}"' for p in pruned)
            raise errors.bad_request(
                f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: strict decoding error: {unknown}'
            )
        if opts.field_validation == "Warn":
            warnings[:0] = [f'unknown field "{p}"' for p in pruned]
        causes.extend(builtins.validate(rt.group, rt.plural, new, old.obj if old else None))
        if rt.key == CRD_KEY:
            causes.extend(crds.validate(new))
        if causes:
            raise errors.invalid(rt.kind, rt.group, name, causes)
        if spec is not None and admitted_by is not None:
            spec.remember(admitted_by, pruned)
        return warnings, admitted_by

    def _admitter(self, rt: ResourceType, version: str) -> Schema | str | None:
        """What prunes, defaults and validates a write of ``rt`` at ``version``: a custom
        resource version's compiled schema, a built-in kind's definition name, or nothing."""
        info = rt.versions.get(version)
        if info is not None and info.schema is not None:
            return info.schema
        if not rt.custom:
            return builtin_schemas.kind_definition(rt.group, version, rt.kind)
        return None

    def after_delete(self, rt: ResourceType, gone: Stored) -> None:
        if rt.key == CRD_KEY:
            spec = gone.obj["spec"]
            group, plural = spec["group"], spec["names"]["plural"]
            for instance in list(self.store.iter(group, plural, None)):
                self.store.delete(group, plural, instance)
            self.registry.remove(spec["group"], spec["names"]["plural"])
            self.store.drop_bucket(spec["group"], spec["names"]["plural"])


class _SpecMemo:
    """Skips walking the ``spec`` of a create that is byte for byte the spec of the last create
    the same schema admitted without pruning anything or an error: that walk can only set the
    same defaults and find the same nothing, so the spec as admitted then is installed instead.
    A warm pool's members, and the pods made from them, are created from one template, and
    walking a pod template (built-in pruning, or a custom resource's schema) was the largest
    single cost of those creates; a Sandbox's spec always gets a default (``operatingMode``), so
    a memo of unchanged specs only never held one. Anything else is walked as before."""

    def __init__(self, memo: dict[Any, tuple[object, bytes, bytes]], key: Any, new: dict[str, Any]) -> None:
        self._memo = memo
        self._key = key
        self._new = new
        value = new.get("spec")
        self._before = jsonwire.dumps(value) if isinstance(value, dict) else None
        self._hit = False

    def admitted_by(self, schema: object) -> bool:
        """The same schema (a compiled schema, or a built-in definition's name) admitted exactly
        this spec, unchanged, last time."""
        seen = self._memo.get(self._key)
        same = seen is not None and (seen[0] is schema or (isinstance(schema, str) and seen[0] == schema))
        self._hit = same and seen is not None and seen[1] == self._before
        return self._hit

    def as_old(self) -> dict[str, Any]:
        """After a hit: the spec as admitted last time is the new object's (defaults set), and an
        "old object" for the walk's ratcheting whose spec is that one, so it is skipped."""
        seen = self._memo[self._key]
        if seen[2] != seen[1]:
            self._new["spec"] = jsonwire.loads(seen[2])
        return {"spec": self._new["spec"]}

    def remember(self, schema: object, pruned: list[str]) -> None:
        """After a successful validation that pruned nothing in the spec (a hit would give no
        warning): remember the spec as it came and as the walk left it."""
        if self._hit or self._before is None or any(p == "spec" or p.startswith(("spec.", "spec[")) for p in pruned):
            return
        self._memo[self._key] = (schema, self._before, jsonwire.dumps(self._new.get("spec")))


def _same_admitter(a: object, b: object) -> bool:
    """Two admitters are the same compiled schema (by identity), or the same definition name."""
    return a is not None and (a is b or (isinstance(a, str) and a == b))


def _check_patch_type(rt: ResourceType, content_type: str) -> None:
    if content_type not in PATCH_TYPES:
        raise errors.unsupported_media_type(content_type)
    if content_type == STRATEGIC and rt.custom:
        raise errors.ApiError(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )


def _name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _json(raw: bytes) -> Any:
    return jsonwire.loads(raw or b"null")
