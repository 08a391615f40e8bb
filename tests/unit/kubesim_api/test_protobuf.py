"""Decoding kubectl's protobuf request bodies (wire format built by hand here)."""

from __future__ import annotations

import pytest

from kubesim.apiserver import errors, protobuf


def varint(n: int) -> bytes:
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field(number: int, value: bytes | int) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version.encode()) + field(2, kind.encode())
    return protobuf.MAGIC + field(1, type_meta) + field(2, raw) + field(3, b"") + field(4, b"")


def test_configmap_with_labels_and_binary_data() -> None:
    meta = field(1, b"cm") + field(2, b"") + field(11, field(1, b"app") + field(2, b"web"))
    raw = (
        field(1, meta)
        + field(2, field(1, b"a") + field(2, b"1"))
        + field(2, field(1, b"b") + field(2, b"2"))
        + field(3, field(1, b"bin") + field(2, b"\x00\x01"))
    )
    assert protobuf.decode(envelope("v1", "ConfigMap", raw)) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "labels": {"app": "web"}},
        "data": {"a": "1", "b": "2"},
        "binaryData": {"bin": "AAE="},
    }


def test_token_request() -> None:
    spec = field(1, b"aud-1") + field(1, b"aud-2") + field(4, 600) + field(3, field(1, b"Pod") + field(3, b"p"))
    body = envelope("authentication.k8s.io/v1", "TokenRequest", field(1, b"") + field(2, spec))
    assert protobuf.decode(body)["spec"] == {
        "audiences": ["aud-1", "aud-2"],
        "expirationSeconds": 600,
        "boundObjectRef": {"kind": "Pod", "name": "p"},
    }


def test_unknown_kinds_and_garbage_are_rejected() -> None:
    with pytest.raises(errors.ApiError) as unknown:
        protobuf.decode(envelope("apps/v1", "Deployment", b""))
    assert unknown.value.code == 415
    with pytest.raises(errors.ApiError) as no_magic:
        protobuf.decode(b"{}")
    assert no_magic.value.code == 415
    with pytest.raises(errors.ApiError) as truncated:
        protobuf.decode(protobuf.MAGIC + b"\x0a\xff")
    assert truncated.value.code == 400
