"""Kubernetes resource quantities: parse, validate and normalise cpu and memory.

Normal forms make equal amounts compare equal everywhere (fingerprints, pools, requests):
cpu becomes whole millicores ("0.2" and "200m" -> "200m", "2000m" -> "2"); memory becomes
bytes rendered with the largest binary suffix that divides it exactly ("1Gi" and "1024Mi" ->
"1Gi"); an amount no binary suffix divides ("1G") is rendered as plain bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from warmshell.core.errors import InvalidArgumentError

__all__ = ["cpu_millis", "memory_bytes", "normalize_cpu", "normalize_memory", "render_cpu", "render_memory"]

# Same grammar as k8s.io/apimachinery resource.Quantity: a signed decimal number followed by a
# binary suffix, a decimal suffix, or a decimal exponent.
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_RENDER_BINARY = [
    ("Ei", 2**60),
    ("Pi", 2**50),
    ("Ti", 2**40),
    ("Gi", 2**30),
    ("Mi", 2**20),
    ("Ki", 2**10),
]
_MAX_DIGITS = 40


def _parse(field: str, text: str) -> Decimal:
    text = text.strip()
    if len(text) > _MAX_DIGITS:
        raise InvalidArgumentError(field, f"quantity {text[:16]!r}... is longer than {_MAX_DIGITS} characters")
    match = _QUANTITY.match(text)
    if match is None:
        raise InvalidArgumentError(field, f"{text!r} is not a Kubernetes quantity (examples: 500m, 0.5, 2, 256Mi, 1Gi)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise InvalidArgumentError(field, f"{text!r} is not a number") from exc
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:  # an exponent; "E" alone is the exa suffix
        return value.scaleb(int(suffix[1:]))
    return value * _DECIMAL[suffix]


def cpu_millis(text: str, *, field: str = "resources.cpu") -> int:
    """Whole millicores of a cpu quantity; it must be positive and a multiple of 1m."""
    value = _parse(field, text) * 1000
    if value <= 0:
        raise InvalidArgumentError(field, f"{text!r} must be greater than zero")
    if value != value.to_integral_value():
        raise InvalidArgumentError(field, f"{text!r} must be a whole number of millicores (1m precision)")
    return int(value)


def memory_bytes(text: str, *, field: str = "resources.memory") -> int:
    """Whole bytes of a memory quantity; it must be positive and integral."""
    value = _parse(field, text)
    if value <= 0:
        raise InvalidArgumentError(field, f"{text!r} must be greater than zero")
    if value != value.to_integral_value():
        raise InvalidArgumentError(field, f"{text!r} must be a whole number of bytes")
    return int(value)


def render_cpu(millis: int) -> str:
    """The normal form of an amount of millicores ("" for 0: no request)."""
    if not millis:
        return ""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def render_memory(size: int) -> str:
    """The normal form of an amount of bytes ("" for 0: no request)."""
    if not size:
        return ""
    for suffix, unit in _RENDER_BINARY:
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def normalize_cpu(text: str, *, field: str = "resources.cpu") -> str:
    """Normal form of a cpu quantity ("" stays "": no request)."""
    return "" if not text.strip() else render_cpu(cpu_millis(text, field=field))


def normalize_memory(text: str, *, field: str = "resources.memory") -> str:
    """Normal form of a memory quantity ("" stays "": no request)."""
    return "" if not text.strip() else render_memory(memory_bytes(text, field=field))
