"""Structural OpenAPI v3 schemas for custom resources, compiled once per CRD version.

``Schema.admit`` does in one walk what the real server does on every write of a custom resource:
prune unknown fields (unless ``x-kubernetes-preserve-unknown-fields``), apply defaults, and validate
types, required fields, enums, bounds and patterns, reporting field errors in upstream's wording.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

from kubesim.apiserver import cel

_MISSING = object()

FieldError = dict[str, str]


def _go_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def render_value(value: Any) -> str:
    """Print a value the way field.ErrorList does (strings quoted, numbers bare)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _err(path: str, reason: str, message: str) -> FieldError:
    return {"reason": reason, "message": message, "field": path}


@dataclass
class Schema:
    """One compiled schema node."""

    type: str | None = None
    properties: dict[str, Schema] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    items: Schema | None = None
    additional: Schema | None = None
    preserve_unknown: bool = False
    int_or_string: bool = False
    embedded: bool = False
    nullable: bool = False
    enum: list[Any] | None = None
    default: Any = _MISSING
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_min: bool = False
    exclusive_max: bool = False
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    any_of: list[Schema] = field(default_factory=list)
    list_type: str | None = None
    list_map_keys: tuple[str, ...] = ()
    map_type: str | None = None
    rules: list[tuple[cel.Expr, str]] = field(default_factory=list)

    # ---- walking -----------------------------------------------------------------------------

    def admit(
        self, obj: dict[str, Any], old: dict[str, Any] | None = None, *, old_admitted: bool = False
    ) -> tuple[list[FieldError], list[str]]:
        """Prune, default and validate a whole object in place; return (errors, pruned paths).

        The root's ``apiVersion``, ``kind`` and ``metadata`` are the server's, never pruned here.
        ``old_admitted``: ``old`` was admitted by this very schema, so a value equal to its old
        value (a field of an object, or an array item at the same index) is already pruned,
        defaulted and valid and is not walked again (validation ratcheting: an unchanged value is
        not judged anew). A status write then skips the spec, which holds a whole pod template,
        and the conditions that did not change.
        """
        errs: list[FieldError] = []
        pruned: list[str] = []
        ratchet = old_admitted and old is not None
        self._object(obj, "", errs, pruned, root=True, old=old, ratchet=ratchet)
        return errs, pruned

    def _walk(
        self,
        value: Any,
        path: str,
        errs: list[FieldError],
        pruned: list[str],
        old: Any,
        ratchet: bool = False,
    ) -> None:
        if value is None:
            if not self.nullable:
                errs.append(
                    _err(
                        path,
                        "FieldValueInvalid",
                        f'Invalid value: "null": {path} in body must be of type {self.type or "object"}: "null"',
                    )
                )
            return
        if not self._type_ok(value, path, errs):
            return
        if isinstance(value, dict):
            self._object(value, path, errs, pruned, root=False, old=old, ratchet=ratchet)
        elif isinstance(value, list):
            self._array(value, path, errs, pruned, old, ratchet)
        else:
            self._scalar(value, path, errs)
        if self.enum is not None and value not in self.enum:
            supported = ", ".join(render_value(v) for v in self.enum)
            errs.append(
                _err(
                    path,
                    "FieldValueNotSupported",
                    f"Unsupported value: {render_value(value)}: supported values: {supported}",
                )
            )
        if self.any_of and not any(s._probe(value, path) for s in self.any_of):
            errs.append(
                _err(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {render_value(value)}: must validate at least one schema (anyOf)",
                )
            )
        if self.rules:
            self._check_rules(value, path, errs, old)

    def _probe(self, value: Any, path: str) -> bool:
        errs: list[FieldError] = []
        probe = copy.deepcopy(value) if isinstance(value, dict | list) else value
        self._walk(probe, path, errs, [], _MISSING)
        return not errs

    def _type_ok(self, value: Any, path: str, errs: list[FieldError]) -> bool:
        if self.int_or_string:
            ok = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
            if not ok:
                errs.append(
                    _err(
                        path,
                        "FieldValueInvalid",
                        f"Invalid value: {render_value(value)}: "
                        f'{path} in body must be of type integer,string: "{_go_type(value)}"',
                    )
                )
            return ok
        t = self.type
        if t is None:
            return True
        got = _go_type(value)
        ok = got == t or (t == "number" and got == "integer")
        if not ok and t == "integer" and isinstance(value, float) and value.is_integer():
            ok = True
        if not ok:
            errs.append(
                _err(
                    path,
                    "FieldValueInvalid",
                    f'Invalid value: "{got}": {path} in body must be of type {t}: "{got}"',
                )
            )
        return ok

    def _object(
        self,
        obj: dict[str, Any],
        path: str,
        errs: list[FieldError],
        pruned: list[str],
        *,
        root: bool,
        old: Any,
        ratchet: bool = False,
    ) -> None:
        keep_meta = root or self.embedded
        for name, prop in self.properties.items():
            if name not in obj and prop.default is not _MISSING:
                obj[name] = copy.deepcopy(prop.default)
        for name in list(obj):
            child_path = f"{path}.{name}" if path else name
            if keep_meta and name in ("apiVersion", "kind", "metadata"):
                if name == "metadata" and not root and isinstance(obj[name], dict):
                    _prune_embedded_metadata(obj[name], child_path, pruned)
                continue
            sub: Schema | None = self.properties.get(name)
            if sub is None:
                sub = self.additional
            if sub is None:
                if not self.preserve_unknown:
                    del obj[name]
                    pruned.append(child_path)
                continue
            old_child = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
            if ratchet and old_child is not _MISSING and old_child == obj[name]:
                continue  # ratcheting: unchanged since this schema admitted it
            sub._walk(obj[name], child_path, errs, pruned, old_child, ratchet)
        for name in self.required:
            if name not in obj:
                child_path = f"{path}.{name}" if path else name
                errs.append(_err(child_path, "FieldValueRequired", "Required value"))

    def _array(
        self,
        arr: list[Any],
        path: str,
        errs: list[FieldError],
        pruned: list[str],
        old: Any,
        ratchet: bool = False,
    ) -> None:
        if self.max_items is not None and len(arr) > self.max_items:
            errs.append(
                _err(path, "FieldValueTooMany", f"Too many: {len(arr)}: must have at most {self.max_items} items")
            )
        if self.min_items is not None and len(arr) < self.min_items:
            errs.append(
                _err(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {len(arr)}: {path} in body should have at least {self.min_items} items",
                )
            )
        if self.items is None:
            return
        olds = old if ratchet and isinstance(old, list) else ()
        for i, item in enumerate(arr):
            if i < len(olds) and olds[i] == item:
                continue  # ratcheting: the same item at the same index, admitted by this schema
            # Transition rules never see an item's old value (items are not correlated).
            self.items._walk(item, f"{path}[{i}]", errs, pruned, _MISSING, ratchet)
        if self.list_type in ("map", "set"):
            self._unique(arr, path, errs)

    def _unique(self, arr: list[Any], path: str, errs: list[FieldError]) -> None:
        # x-kubernetes-list-type map/set: keys (or whole values) must not repeat.
        seen: set[str] = set()
        for i, item in enumerate(arr):
            if self.list_type == "map" and isinstance(item, dict):
                key: Any = {k: item.get(k) for k in self.list_map_keys}
            else:
                key = item
            token = json.dumps(key, sort_keys=True, separators=(",", ":"))
            if token in seen:
                errs.append(_err(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {token}"))
            seen.add(token)

    def _scalar(self, value: Any, path: str, errs: list[FieldError]) -> None:
        if isinstance(value, str):
            if self.max_length is not None and len(value) > self.max_length:
                errs.append(_err(path, "FieldValueTooLong", f"Too long: may not be more than {self.max_length} bytes"))
            if self.min_length is not None and len(value) < self.min_length:
                errs.append(
                    _err(
                        path,
                        "FieldValueInvalid",
                        f"Invalid value: {render_value(value)}: "
                        f"{path} in body should be at least {self.min_length} chars long",
                    )
                )
            if self.pattern is not None and not self.pattern.search(value):
                errs.append(
                    _err(
                        path,
                        "FieldValueInvalid",
                        f"Invalid value: {render_value(value)}: {path} in body should match '{self.pattern_text}'",
                    )
                )
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if self.minimum is not None:
                bad = value <= self.minimum if self.exclusive_min else value < self.minimum
                if bad:
                    op = "greater than" if self.exclusive_min else "greater than or equal to"
                    errs.append(
                        _err(
                            path,
                            "FieldValueInvalid",
                            f"Invalid value: {render_value(value)}: {path} in body should be {op} {_num(self.minimum)}",
                        )
                    )
            if self.maximum is not None:
                bad = value >= self.maximum if self.exclusive_max else value > self.maximum
                if bad:
                    op = "less than" if self.exclusive_max else "less than or equal to"
                    errs.append(
                        _err(
                            path,
                            "FieldValueInvalid",
                            f"Invalid value: {render_value(value)}: {path} in body should be {op} {_num(self.maximum)}",
                        )
                    )

    def _check_rules(self, value: Any, path: str, errs: list[FieldError], old: Any) -> None:
        for expr, message in self.rules:
            if expr.uses_old_self and old is _MISSING:
                continue  # transition rules only run on updates where the old value exists
            try:
                ok = expr.evaluate(value, None if old is _MISSING else old)
            except cel.CelError as exc:
                errs.append(_err(path, "FieldValueInvalid", f'Invalid value: "object": {exc}'))
                continue
            if ok is not True:
                errs.append(_err(path, "FieldValueInvalid", f'Invalid value: "object": {message}'))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_EMBEDDED_META = {"name", "namespace", "labels", "annotations", "generateName", "finalizers"}


def _prune_embedded_metadata(meta: dict[str, Any], path: str, pruned: list[str]) -> None:
    # Embedded ObjectMeta keeps only the fields upstream keeps for x-kubernetes-embedded-resource.
    for key in list(meta):
        if key not in _EMBEDDED_META:
            del meta[key]
            pruned.append(f"{path}.{key}")


def compile_schema(raw: dict[str, Any]) -> Schema:
    """Compile a CRD version's ``openAPIV3Schema`` (structural) into a ``Schema`` tree."""
    s = Schema(
        type=raw.get("type"),
        required=tuple(raw.get("required") or ()),
        preserve_unknown=bool(raw.get("x-kubernetes-preserve-unknown-fields")),
        int_or_string=bool(raw.get("x-kubernetes-int-or-string")),
        embedded=bool(raw.get("x-kubernetes-embedded-resource")),
        nullable=bool(raw.get("nullable")),
        enum=raw.get("enum"),
        default=raw.get("default", _MISSING),
        minimum=raw.get("minimum"),
        maximum=raw.get("maximum"),
        exclusive_min=bool(raw.get("exclusiveMinimum")),
        exclusive_max=bool(raw.get("exclusiveMaximum")),
        min_length=raw.get("minLength"),
        max_length=raw.get("maxLength"),
        min_items=raw.get("minItems"),
        max_items=raw.get("maxItems"),
        list_type=raw.get("x-kubernetes-list-type"),
        list_map_keys=tuple(raw.get("x-kubernetes-list-map-keys") or ()),
        map_type=raw.get("x-kubernetes-map-type"),
    )
    if "pattern" in raw:
        s.pattern_text = raw["pattern"]
        s.pattern = re.compile(raw["pattern"])
    for name, sub in (raw.get("properties") or {}).items():
        s.properties[name] = compile_schema(sub)
    if isinstance(raw.get("items"), dict):
        s.items = compile_schema(raw["items"])
    additional = raw.get("additionalProperties")
    if isinstance(additional, dict):
        s.additional = compile_schema(additional)
    elif additional is True:
        s.preserve_unknown = True
    if not s.int_or_string:
        s.any_of = [compile_schema(b) for b in raw.get("anyOf") or ()]
    for rule in raw.get("x-kubernetes-validations") or ():
        expr = cel.parse(rule["rule"])
        s.rules.append((expr, rule.get("message") or f"failed rule: {rule['rule']}"))
    return s
