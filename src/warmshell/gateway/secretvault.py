"""Where a sandbox's secrets rest between its create and its (re-)activations: sealed in the store.

The create's secret values never enter the sandbox record (which is shown, watched and logged);
they are sealed with AES-256-GCM into an object of their own, keyed by the sandbox id and written
in the same statement as the record (`sealed`), so that a gateway restart or a supervisor
restarted in its pod can be activated with them again. The associated data binds the ciphertext
to the sandbox id: a sealed blob copied under another sandbox's id does not open. Deleting the
sandbox deletes the object, in its record's statement too (`rows`).

The key is 32 random bytes in a 0600 file (`drivers.keyfiles`): `<state_dir>/secrets.key` by
default, created on first start under the gateway's private umask; `secrets_key_file` names
another file (on Kubernetes, a Secret mounted into the gateway's pod, the same for every
replica). Losing the key loses the secrets of sandboxes not yet activated again: their
re-activation is refused, never done without.

A create's own activation takes the values from memory instead (`handover`, see
`gateway.secrethandover`); every other activation opens the sealed row.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from warmshell.core.errors import FailedPreconditionError
from warmshell.core.ids import SandboxId
from warmshell.drivers.keyfiles import KEY_BYTES
from warmshell.gateway.secrethandover import SecretHandover
from warmshell.gateway.store.base import NewObject, Store

__all__ = ["KIND_SECRETS", "SecretVault"]

KIND_SECRETS = "sealed-secrets"
_NONCE_BYTES = 12
_VERSION = 1


def _context(sandbox_id: str) -> bytes:
    return f"warmshell-sandbox-secrets/v{_VERSION}\0{sandbox_id}".encode()


class SecretVault:
    """Seals the secrets of one sandbox at a time into the row its record's write carries, and
    opens them; `handover` carries a create's values to its own activation in memory."""

    def __init__(self, store: Store, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError("the secrets key must be 32 bytes")
        self._store = store
        self._aead = AESGCM(key)
        self.handover = SecretHandover()

    def _seal(self, sandbox_id: SandboxId, values: Mapping[str, str]) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        plain = json.dumps(dict(values), sort_keys=True).encode()
        sealed = self._aead.encrypt(nonce, plain, _context(sandbox_id))
        return json.dumps({"v": _VERSION, "sealed": base64.b64encode(nonce + sealed).decode()})

    def sealed(self, sandbox_id: SandboxId, workspace: str, values: Mapping[str, str]) -> tuple[NewObject, ...]:
        """The sandbox's secrets sealed into the row that keeps them, for the store to write with
        its record (`SandboxRecords.insert`'s `beside`); none when there are none."""
        if not values:
            return ()
        payload = self._seal(sandbox_id, values)
        return (NewObject(kind=KIND_SECRETS, id=sandbox_id, name=sandbox_id, workspace=workspace, payload=payload),)

    async def get(self, sandbox_id: SandboxId) -> dict[str, str]:
        """The sandbox's secrets ({} when it has none); FailedPreconditionError when they are
        sealed but do not open (another key, or a blob of another sandbox)."""
        row = await self._store.get(KIND_SECRETS, sandbox_id)
        if row is None:
            return {}
        try:
            raw = base64.b64decode(json.loads(row.payload)["sealed"], validate=True)
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _context(sandbox_id))
            values = json.loads(plain)
        except (binascii.Error, ValueError, KeyError, TypeError, InvalidTag) as exc:
            raise FailedPreconditionError(
                f"the secrets of sandbox {sandbox_id} do not open with this gateway's secrets key"
            ) from exc
        return {str(k): str(v) for k, v in values.items()}

    @staticmethod
    def rows(sandbox_id: SandboxId) -> tuple[tuple[str, str], ...]:
        """The (kind, id) of the row that keeps the sandbox's secrets, for the store to delete
        with its record (`SandboxRecords.remove`'s `beside`; no error when it had none)."""
        return ((KIND_SECRETS, sandbox_id),)
