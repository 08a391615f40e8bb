"""Bootstrap credentials of local supervisors: ``wsl1.<instance_id>.<secret>``.

The driver writes a fresh credential into a pipe that only the new supervisor can read and keeps
nothing but its SHA-256, so neither the record on disk nor a memory dump of the driver can be
replayed as a registration.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from warmshell.core.ids import InstanceId

__all__ = ["INSTANCE_PREFIX", "PREFIX", "digest", "instance_of", "matches", "new_credential", "new_instance_id"]

PREFIX = "wsl1."
_SECRET_BYTES = 32  # 256 bits


INSTANCE_PREFIX = "li-"


def new_instance_id() -> InstanceId:
    """A fresh local instance id (no dots, so it can sit inside a credential)."""
    return InstanceId(f"{INSTANCE_PREFIX}{secrets.token_hex(8)}")


def new_credential(instance_id: InstanceId) -> str:
    """A fresh credential for one instance; show it to nobody but that instance."""
    return f"{PREFIX}{instance_id}.{secrets.token_urlsafe(_SECRET_BYTES)}"


def digest(credential: str) -> str:
    """The SHA-256 hex the driver keeps instead of the credential."""
    return hashlib.sha256(credential.encode()).hexdigest()


def instance_of(credential: str) -> InstanceId | None:
    """The instance id a ``wsl1.`` credential claims, or None when it is malformed."""
    if not credential.startswith(PREFIX):
        return None
    instance, dot, secret = credential[len(PREFIX) :].partition(".")
    if not instance or not dot or not secret:
        return None
    return InstanceId(instance)


def matches(credential: str, expected_digest: str) -> bool:
    """Constant-time check of a presented credential against a kept digest."""
    return hmac.compare_digest(digest(credential), expected_digest)
