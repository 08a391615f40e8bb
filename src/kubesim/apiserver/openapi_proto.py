"""``/openapi/v2`` as client-go fetches it: a gnostic ``openapi.v2.Document`` in protobuf.

client-go's discovery client asks only for ``application/com.github.proto-openapi.spec.v2@v1.0+protobuf``
and unmarshals the answer as protobuf, so a JSON-only ``/openapi/v2`` is as good as none to kubectl.
This encodes the subset of the Swagger document kubesim publishes (paths, operations, parameters,
responses, schemas, vendor extensions); field numbers are those of gnostic's OpenAPIv2.proto.
"""

from __future__ import annotations

import json
import struct
from typing import Any

CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, value: str) -> bytes:
    return _bytes(field, value.encode()) if value else b""


def _bool(field: int, value: bool) -> bytes:
    return _varint(field << 3) + b"\x01" if value else b""


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value) if value else b""


def _double(field: int, value: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", value)


def _any(value: Any) -> bytes:
    # Any{yaml = 2}: gnostic keeps free-form values as YAML text.
    return _str(2, json.dumps(value))  # JSON is YAML


def _extensions(field: int, obj: dict[str, Any]) -> bytes:
    # NamedAny{name = 1, value = 2}
    return b"".join(
        _bytes(field, _str(1, k) + _bytes(2, _any(v))) for k, v in sorted(obj.items()) if k.startswith("x-")
    )


def schema(s: dict[str, Any]) -> bytes:
    """Encode a ``Schema`` message."""
    out = [
        _str(1, s.get("$ref", "")),
        _str(2, s.get("format", "")),
        _str(4, s.get("description", "")),
    ]
    if "default" in s:
        out.append(_bytes(5, _any(s["default"])))
    for key, field in (("maximum", 7), ("minimum", 9)):
        if key in s:
            out.append(_double(field, float(s[key])))
    for key, field in (("maxLength", 11), ("minLength", 12), ("maxItems", 14), ("minItems", 15)):
        out.append(_int(field, int(s.get(key, 0))))
    out.append(_str(13, s.get("pattern", "")))
    out.extend(_str(19, r) for r in s.get("required") or ())
    out.extend(_bytes(20, _any(e)) for e in s.get("enum") or ())
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        out.append(_bytes(21, _bytes(1, schema(extra))))
    elif isinstance(extra, bool):
        out.append(_bytes(21, _bool(2, extra) or b"\x10\x00"))
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        out.append(_bytes(22, b"".join(_str(1, t) for t in types)))
    if isinstance(s.get("items"), dict):
        out.append(_bytes(23, _bytes(1, schema(s["items"]))))
    out.extend(_bytes(24, schema(a)) for a in s.get("allOf") or ())
    props = s.get("properties")
    if props:
        named = b"".join(_bytes(1, _str(1, k) + _bytes(2, schema(v))) for k, v in props.items())
        out.append(_bytes(25, named))
    out.append(_extensions(31, s))
    return b"".join(out)


def _parameter(p: dict[str, Any]) -> bytes:
    """ParametersItem{parameter = 1: Parameter{body = 1 | non_body = 2}}."""
    if p.get("in") == "body":
        body = _str(1, p.get("description", "")) + _str(2, p["name"]) + _str(3, "body") + _bool(4, True)
        body += _bytes(5, schema(p.get("schema") or {}))
        return _bytes(1, _bytes(1, body))
    required, where, desc, name = bool(p.get("required")), p["in"], p.get("description", ""), p["name"]
    if where == "path":
        # PathParameterSubSchema: required 1, in 2, description 3, name 4, type 5
        sub = _bool(1, required) + _str(2, where) + _str(3, desc) + _str(4, name) + _str(5, p.get("type", "string"))
        non_body = _bytes(4, sub)
    else:
        # QueryParameterSubSchema: required 1, in 2, description 3, name 4, type 6, unique_items 20
        sub = _bool(1, required) + _str(2, where) + _str(3, desc) + _str(4, name) + _str(6, p.get("type", "string"))
        sub += _bool(20, bool(p.get("uniqueItems")))
        non_body = _bytes(3, sub)
    return _bytes(1, _bytes(2, non_body))


def _operation(op: dict[str, Any]) -> bytes:
    out = [_str(3, op.get("description", "")), _str(5, op.get("operationId", ""))]
    out.extend(_str(6, t) for t in op.get("produces") or ())
    out.extend(_str(7, t) for t in op.get("consumes") or ())
    out.extend(_bytes(8, _parameter(p)) for p in op.get("parameters") or ())
    codes = b""
    for code, response in (op.get("responses") or {}).items():
        # Response{description 1, schema 2: SchemaItem{schema 1}} inside ResponseValue{response 1}
        body = _str(1, response.get("description", ""))
        if "schema" in response:
            body += _bytes(2, _bytes(1, schema(response["schema"])))
        codes += _bytes(1, _str(1, code) + _bytes(2, _bytes(1, body)))
    out.append(_bytes(9, codes))
    out.append(_extensions(13, op))
    return b"".join(out)


_METHODS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}


def _path_item(item: dict[str, Any]) -> bytes:
    out = [_bytes(_METHODS[m], _operation(op)) for m, op in item.items() if m in _METHODS]
    out.extend(_bytes(9, _parameter(p)) for p in item.get("parameters") or ())
    return b"".join(out)


def encode(document: dict[str, Any]) -> bytes:
    """Encode a Swagger 2.0 document (as ``OpenApi.v2_document`` builds it) as ``openapi.v2.Document``."""
    info = document.get("info") or {}
    out = [
        _str(1, document.get("swagger", "2.0")),
        _bytes(2, _str(1, info.get("title", "")) + _str(2, info.get("version", ""))),
    ]
    paths = b"".join(_bytes(2, _str(1, p) + _bytes(2, _path_item(item))) for p, item in document["paths"].items())
    out.append(_bytes(8, paths))
    defs = b"".join(_bytes(1, _str(1, n) + _bytes(2, schema(s))) for n, s in document["definitions"].items())
    out.append(_bytes(9, defs))
    return b"".join(out)
