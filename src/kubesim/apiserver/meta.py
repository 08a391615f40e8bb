"""Small ObjectMeta helpers: timestamps, uids, generateName, name validation."""

from __future__ import annotations

import json
import re
import secrets
import uuid
from datetime import UTC, datetime
from typing import Any

_ALNUM = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet (no vowels, 0,1,3)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def now() -> str:
    """RFC 3339 UTC with second precision, as metav1.Time serialises."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_uid() -> str:
    """A fresh object uid."""
    return str(uuid.uuid4())


def generate_name(prefix: str) -> str:
    """``prefix`` + 5 random characters, truncating the prefix like SimpleNameGenerator."""
    prefix = prefix[: 63 - 5]
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(5))


def name_errors(name: str, *, label: bool = False) -> list[str]:
    """Messages for an invalid object name (empty list when valid)."""
    limit = 63 if label else 253
    pattern = _DNS_LABEL if label else _DNS_SUBDOMAIN
    out: list[str] = []
    if len(name) > limit:
        out.append(f"must be no more than {limit} characters")
    if not pattern.match(name):
        kind = "RFC 1123 label" if label else "lowercase RFC 1123 subdomain"
        example = "'my-name',  or '123-abc'" if label else "'example.com'"
        out.append(
            f"a {kind} must consist of lower case alphanumeric characters, '-' or '.', and must "
            f"start and end with an alphanumeric character (e.g. {example})"
        )
    return out


def metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj.metadata``, created if missing."""
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


ANNOTATIONS_LIMIT = 256 * 1024
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    out = []
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        out.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        out.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
            "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return out


def metadata_errors(m: dict[str, Any], old: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """ObjectMeta validation: label keys and values, annotation keys and total annotation size.

    ``old``: the stored version's metadata, which passed this validation: labels, or annotations,
    equal to its are not checked again (a warm claim writes its objects ~24 times, mostly their
    status, and the labels and annotations of each were matched against their patterns anew)."""
    labels = m.get("labels") or {}
    annotations = m.get("annotations") or {}
    if old is not None:
        labels = {} if labels == (old.get("labels") or {}) else labels
        annotations = {} if annotations == (old.get("annotations") or {}) else annotations
    errs: list[dict[str, str]] = []
    for key, value in labels.items():
        for message in _key_errors(str(key)):
            errs.append(
                {
                    "field": "metadata.labels",
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "{key}": {message}',
                }
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errs.append(
                {
                    "field": "metadata.labels",
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {json.dumps(value)}: a valid label must be an empty string "
                    "or consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                    "an alphanumeric character, and be at most 63 characters",
                }
            )
    total = 0
    for key, value in annotations.items():
        for message in _key_errors(str(key)):
            errs.append(
                {
                    "field": "metadata.annotations",
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "{key}": {message}',
                }
            )
        total += len(str(key)) + len(str(value))
    if total > ANNOTATIONS_LIMIT:
        errs.append(
            {
                "field": "metadata.annotations",
                "reason": "FieldValueTooLong",
                "message": f"Too long: may not be more than {ANNOTATIONS_LIMIT} bytes",
            }
        )
    return errs
