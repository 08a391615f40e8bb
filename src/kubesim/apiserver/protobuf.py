"""Decode the protobuf bodies kubectl's typed commands send, for the few kinds they create.

``kubectl create namespace|secret|configmap|serviceaccount|token``, ``kubectl create role|rolebinding|
clusterrole|clusterrolebinding`` and ``kubectl auth can-i [--list]|whoami`` POST
``application/vnd.kubernetes.protobuf``: the ``k8s\\x00`` magic, then a ``runtime.Unknown`` envelope
(typeMeta = 1, raw = 2) around the object. Field numbers below are those of k8s.io/api's
generated.proto. Other kinds stay 415, as on a JSON-only server; answers are always JSON, which
client-go accepts.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Union

from kubesim.apiserver import errors

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


@dataclass(frozen=True)
class Map:
    """A ``map<key, value>`` field (repeated entries with key = 1, value = 2)."""

    value: str  # "string" or "bytes"


@dataclass(frozen=True)
class Repeated:
    """A repeated scalar or message field."""

    item: FieldType


FieldType = Union[str, "Schema", Map, Repeated]
Schema = dict[int, tuple[str, FieldType]]

OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    11: ("labels", Map("string")),
    12: ("annotations", Map("string")),
    14: ("finalizers", Repeated("string")),
}
KINDS: dict[str, Schema] = {
    "ConfigMap": {
        1: ("metadata", OBJECT_META),
        2: ("data", Map("string")),
        3: ("binaryData", Map("bytes")),
        4: ("immutable", "bool"),
    },
    "Secret": {
        1: ("metadata", OBJECT_META),
        2: ("data", Map("bytes")),
        3: ("type", "string"),
        4: ("stringData", Map("string")),
        5: ("immutable", "bool"),
    },
    # Helm deletes its release Secrets with a protobuf DeleteOptions body.
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int"),
        2: ("preconditions", {1: ("uid", "string"), 2: ("resourceVersion", "string")}),
        3: ("orphanDependents", "bool"),
        4: ("propagationPolicy", "string"),
        5: ("dryRun", Repeated("string")),
    },
    "Namespace": {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("finalizers", Repeated("string"))})},
    "ServiceAccount": {1: ("metadata", OBJECT_META), 4: ("automountServiceAccountToken", "bool")},
    "TokenRequest": {
        1: ("metadata", OBJECT_META),
        2: (
            "spec",
            {
                1: ("audiences", Repeated("string")),
                4: ("expirationSeconds", "int"),
                3: (
                    "boundObjectRef",
                    {1: ("kind", "string"), 2: ("apiVersion", "string"), 3: ("name", "string"), 4: ("uid", "string")},
                ),
            },
        ),
    },
    "SelfSubjectAccessReview": {
        1: ("metadata", OBJECT_META),
        2: (
            "spec",
            {
                1: (
                    "resourceAttributes",
                    {
                        1: ("namespace", "string"),
                        2: ("verb", "string"),
                        3: ("group", "string"),
                        4: ("version", "string"),
                        5: ("resource", "string"),
                        6: ("subresource", "string"),
                        7: ("name", "string"),
                    },
                ),
                2: ("nonResourceAttributes", {1: ("path", "string"), 2: ("verb", "string")}),
            },
        ),
    },
    "SelfSubjectReview": {1: ("metadata", OBJECT_META)},
    "SelfSubjectRulesReview": {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("namespace", "string")})},
}

# rbac.authorization.k8s.io/v1 (``kubectl create role|clusterrole|rolebinding|clusterrolebinding``).
_POLICY_RULE: Schema = {
    1: ("verbs", Repeated("string")),
    2: ("apiGroups", Repeated("string")),
    3: ("resources", Repeated("string")),
    4: ("resourceNames", Repeated("string")),
    5: ("nonResourceURLs", Repeated("string")),
}
_SUBJECT: Schema = {1: ("kind", "string"), 2: ("apiGroup", "string"), 3: ("name", "string"), 4: ("namespace", "string")}
_ROLE_REF: Schema = {1: ("apiGroup", "string"), 2: ("kind", "string"), 3: ("name", "string")}
_ROLE: Schema = {1: ("metadata", OBJECT_META), 2: ("rules", Repeated(_POLICY_RULE))}
_BINDING: Schema = {1: ("metadata", OBJECT_META), 2: ("subjects", Repeated(_SUBJECT)), 3: ("roleRef", _ROLE_REF)}
KINDS.update({"Role": _ROLE, "ClusterRole": _ROLE, "RoleBinding": _BINDING, "ClusterRoleBinding": _BINDING})


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, varint value or length-delimited bytes) in wire order."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            out.append((number, buf[i : i + size]))
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4  # fixed-width numbers: none in the kinds we decode
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def _scalar(kind: str, value: int | bytes) -> Any:
    if kind == "string":
        return value.decode() if isinstance(value, bytes) else ""
    if kind == "bytes":
        return base64.b64encode(value).decode() if isinstance(value, bytes) else ""
    if kind == "bool":
        return bool(value)
    return int(value) if isinstance(value, int) else 0


def _value(kind: FieldType, raw: int | bytes) -> Any:
    if isinstance(kind, dict):
        return message(kind, raw if isinstance(raw, bytes) else b"")
    assert isinstance(kind, str)
    return _scalar(kind, raw)


def message(schema: Schema, buf: bytes) -> dict[str, Any]:
    """Decode one message; empty values are dropped, as JSON's omitempty would."""
    out: dict[str, Any] = {}
    for number, raw in _fields(buf):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, Map):
            entry = dict(_fields(raw if isinstance(raw, bytes) else b""))
            key = _scalar("string", entry.get(1, b""))
            out.setdefault(name, {})[key] = _scalar(kind.value, entry.get(2, b""))
        elif isinstance(kind, Repeated):
            out.setdefault(name, []).append(_value(kind.item, raw))
        else:
            value = _value(kind, raw)
            if value not in ("", 0, False, {}):
                out[name] = value
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it encodes; 415 for kinds we cannot decode."""
    unsupported = errors.unsupported_media_type(CONTENT_TYPE)
    if not body.startswith(MAGIC):
        raise unsupported
    try:
        envelope = dict(_fields(body[len(MAGIC) :]))
        type_meta = dict(_fields(_bytes(envelope.get(1))))
        api_version = _scalar("string", type_meta.get(1, b""))
        kind = _scalar("string", type_meta.get(2, b""))
        schema = KINDS.get(kind)
        if schema is None:
            raise unsupported
        obj = message(schema, _bytes(envelope.get(2)))
    except ValueError as exc:
        raise errors.bad_request(f"unable to decode protobuf body: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **obj}


def _bytes(value: int | bytes | None) -> bytes:
    return value if isinstance(value, bytes) else b""
