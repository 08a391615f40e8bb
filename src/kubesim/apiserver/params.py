"""Query-parameter parsing with Go's semantics (ParseBool accepts ``True``, ``1``, ``t``…)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

from kubesim.apiserver import errors

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False", ""}


def boolean(query: Mapping[str, str], key: str, default: bool = False) -> bool:
    """Parse a boolean like strconv.ParseBool; a bad value is a 400, as upstream."""
    raw = query.get(key)
    if raw is None:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise errors.bad_request(f'strconv.ParseBool: parsing "{raw}": invalid syntax')


def integer(query: Mapping[str, str], key: str) -> int | None:
    """Parse an optional integer parameter."""
    raw = query.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise errors.bad_request(f'strconv.ParseInt: parsing "{raw}": invalid syntax') from exc


def resource_version(raw: str | None) -> int | None:
    """``None`` for unset/empty; 400 for something that is not a resourceVersion."""
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise errors.bad_request(f'invalid resource version "{raw}"') from exc


def encode_continue(rv: int, namespace: str, name: str) -> str:
    """An opaque continue token: the list's resourceVersion and the last key served."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [namespace, name]}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """Inverse of ``encode_continue``; a malformed token is a 400."""
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
        return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise errors.bad_request("continue key is not valid: incorrect encoded start resourceVersion") from exc
