"""FNV-1a hashes used by agent-sandbox in labels and selectors (notes §7)."""

from __future__ import annotations

import functools
import json
from typing import Any

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a, as Go's ``hash/fnv.New32a``."""
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h


@functools.lru_cache(maxsize=8192)
def name_hash(name: str) -> str:
    """``NameHash``: FNV-1a of the name, 8 lowercase hex digits (remembered: the same few
    thousand names are hashed on every reconcile, a byte at a time in Python)."""
    return f"{fnv1a_32(name.encode()):08x}"


def json_hash(value: Any) -> str:
    """Hash of a JSON value. Upstream hashes Go's encoding/json output, which we cannot reproduce
    byte for byte; consumers only compare these for equality, so canonical JSON is enough."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return name_hash(text)
