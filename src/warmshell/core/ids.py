"""Identifier types, distinct so that a sandbox id cannot be passed where an instance id belongs."""

from __future__ import annotations

import secrets
import uuid
from typing import NewType

SandboxId = NewType("SandboxId", str)
InstanceId = NewType("InstanceId", str)
SessionId = NewType("SessionId", str)
Fingerprint = NewType("Fingerprint", str)

__all__ = ["Fingerprint", "InstanceId", "SandboxId", "SessionId", "new_sandbox_id", "random_name"]

_NAME_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def new_sandbox_id() -> SandboxId:
    """A fresh, globally unique sandbox id."""
    return SandboxId(str(uuid.uuid4()))


def random_name(prefix: str = "sbx") -> str:
    """A DNS-1123 label such as ``sbx-k3v9q2`` for a sandbox created without a name."""
    suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(6))
    return f"{prefix}-{suffix}"
