"""32-byte symmetric keys in files, shared by whatever seals with AES-256-GCM: the Kubernetes
driver's activation proofs and the gateway's sandbox secrets. A key file holds the key raw or in
base64 (as a mounted Kubernetes Secret does); a missing one is created 0600."""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from pathlib import Path

from warmshell.core.errors import FailedPreconditionError

__all__ = ["KEY_BYTES", "load_or_create_key"]

KEY_BYTES = 32


def load_or_create_key(path: Path) -> bytes:
    """The 32-byte key at `path` (raw or base64), created 0600 on first use."""
    if path.exists():
        data = path.read_bytes().strip()
        if len(data) != KEY_BYTES:
            try:
                data = base64.b64decode(data, validate=True)
            except binascii.Error:
                data = b""
        if len(data) != KEY_BYTES:
            raise FailedPreconditionError(f"{path}: not a 32-byte key (raw or base64)")
        return data
    key = secrets.token_bytes(KEY_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(base64.b64encode(key) + b"\n")
    os.replace(tmp, path)
    return key
