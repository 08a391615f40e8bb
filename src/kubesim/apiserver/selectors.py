"""Label and field selectors, parsed once per request into predicates over objects.

Label syntax follows k8s.io/apimachinery/pkg/labels: ``a=b``, ``a==b``, ``a!=b``,
``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, comma-separated requirements ANDed together.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kubesim.apiserver import errors

Predicate = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_requirements(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _label_requirement(req: str) -> Callable[[dict[str, str]], bool]:
    m = _SET_RE.match(req)
    if m:
        key, op, raw = m.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in req:
            key, value = (s.strip() for s in req.split(op, 1))
            if not key:
                break
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if req.startswith("!"):
        key = req[1:].strip()
        return lambda labels: key not in labels
    if re.fullmatch(r"[A-Za-z0-9_./-]+", req):
        return lambda labels: req in labels
    raise errors.bad_request(f'unable to parse requirement: found "{req}", expected: in, notin, =, ==, !=')


def label_selector(text: str | None) -> Predicate | None:
    """Parse a labelSelector; ``None`` when it selects everything."""
    if not text:
        return None
    reqs = [_label_requirement(r) for r in _split_requirements(text)]

    def match(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r(labels) for r in reqs)

    return match


def _field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


# Real servers accept a per-kind set of field labels; these are the ones our clients use.
_ALLOWED_FIELDS = {
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
    "spec.serviceAccountName",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.kind",
    "involvedObject.namespace",
    "type",
    "reason",
}


def field_selector(text: str | None, *, custom: bool = False) -> Predicate | None:
    """Parse a fieldSelector (``=``, ``==``, ``!=`` only, as upstream)."""
    if not text:
        return None
    checks: list[tuple[str, bool, str]] = []
    for req in _split_requirements(text):
        for op in ("!=", "==", "="):
            if op in req:
                key, value = (s.strip() for s in req.split(op, 1))
                break
        else:
            raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{req}'")
        allowed = key in ("metadata.name", "metadata.namespace") or (not custom and key in _ALLOWED_FIELDS)
        if not allowed:
            raise errors.bad_request(f"field label not supported: {key}")
        checks.append((key, op == "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        return all((_field_value(obj, key) == value) != negate for key, negate, value in checks)

    return match


def combine(*preds: Predicate | None) -> Predicate | None:
    """AND of the given predicates, skipping ``None``."""
    active = [p for p in preds if p is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]
    return lambda obj: all(p(obj) for p in active)


def exact_name(text: str | None) -> str | None:
    """If a field selector pins ``metadata.name=X`` (alone), return X so lookups can skip a scan."""
    if not text:
        return None
    parts = _split_requirements(text)
    if len(parts) == 1 and "!=" not in parts[0]:
        key, _, value = parts[0].replace("==", "=").partition("=")
        if key.strip() == "metadata.name":
            return value.strip()
    return None
