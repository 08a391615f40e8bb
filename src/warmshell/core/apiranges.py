"""The ranges of the wire contract's integer fields that more than one layer checks: the profile
parser and the Kubernetes pool annotations hold a lifetime to it, and the CLI refuses a flag
beyond it before sending. No imports, so the CLI reads it without loading the domain models."""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_LIFETIME_SECONDS"]

# The API carries lifetimes (ttl_seconds, idle_timeout_seconds) as uint32 seconds, about 136 years.
MAX_LIFETIME_SECONDS: Final = 2**32 - 1
