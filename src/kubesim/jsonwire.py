"""JSON as kubesim encodes and decodes it, on the wire and between its own components: orjson.

Every write under warm creates is decoded and encoded several times (the request body, the
private copy the verb edits, the stored object's encoding shared by every reader, the answer
decoded by the in-process client): with the standard library's ``json`` that was a fifth of the
API server's CPU, and orjson does the same work several times faster.

Numbers decode as Kubernetes' own decoder (sigs.k8s.io/json) decodes them into unstructured
objects: integers that fit in 64 bits as integers, larger ones as floats; ``NaN`` and
``Infinity`` are not JSON and are refused, as there.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TypeVar

import orjson

T = TypeVar("T")
# Anything but plain JSON values (dates, dataclasses, subclasses of str or dict) is refused, so
# that a copy never silently turns one into a string: those fall back to ``copy.deepcopy``.
_PLAIN_ONLY = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, object keys in insertion order."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        # orjson refuses integers beyond 64 bits and non-string keys; keep encoding what the
        # standard library took before rather than failing a write.
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def loads(raw: bytes | str) -> Any:
    """Decode one JSON document; ``ValueError`` (``json.JSONDecodeError``) when it is not one."""
    return orjson.loads(raw)


def copy_of(doc: T) -> T:
    """A deep copy of a JSON document (tuples come back as lists): encoded and decoded again by
    orjson, about four times cheaper than ``copy.deepcopy`` on a pod; the controllers copy every
    object they edit, several per warm claim."""
    try:
        copied: T = orjson.loads(orjson.dumps(doc, option=_PLAIN_ONLY))
    except TypeError:
        return copy.deepcopy(doc)
    return copied
