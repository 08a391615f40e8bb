"""Sealing the activation proof onto the Sandbox, so that only the gateway can read it back.

A cold sandbox's supervisor is bound at create: when it registers, the identity provider must hand
the gateway the activation proof generated for that sandbox. We keep it on the Sandbox object
itself (no extra API write per create, no Secret to garbage-collect) as an annotation sealed with
AES-256-GCM under a key only gateways hold.

Threat model:
- Anyone who can *read* Sandbox objects (a `view` role, a dashboard, a log of the object) sees only
  ciphertext; without the key they cannot produce the proof, so they cannot get a foreign pod
  activated as someone else's sandbox.
- The associated data binds the ciphertext to (namespace, object name, sandbox id): copying the
  annotation onto another Sandbox, or pairing it with another sandbox id, fails authentication.
- Someone who can *write* Sandboxes or pods in the sandbox namespace, or read the key, is trusted:
  they could replace a sandbox's pod template anyway. The namespace is a trust boundary of the
  gateway, not a tenant boundary (as in OpenShell's design).
- The key lives in a 0600 file (default `<state_dir>/kubernetes-proof.key`); replicated gateways
  must share it (mount it from a Secret). Losing it only affects supervisors that register after
  the loss: they are refused and their sandboxes end in Error.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from warmshell.drivers.keyfiles import load_or_create_key

__all__ = ["PREFIX", "ProofSealer", "load_or_create_key"]

PREFIX = "v1."
_KEY_BYTES = 32
_NONCE_BYTES = 12


class ProofSealer:
    """Seals and opens activation proofs bound to one Sandbox object."""

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise ValueError("the proof key must be 32 bytes")
        self._aead = AESGCM(key)

    def seal(self, proof: str, *, namespace: str, name: str, sandbox_id: str) -> str:
        """The annotation value carrying `proof` for that object."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, proof.encode(), _context(namespace, name, sandbox_id))
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def open(self, value: str, *, namespace: str, name: str, sandbox_id: str) -> str | None:
        """The proof, or None when the value is missing, malformed, or sealed for another object."""
        if not value.startswith(PREFIX):
            return None
        text = value[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _context(namespace, name, sandbox_id))
        except (binascii.Error, ValueError, InvalidTag):
            return None
        return plain.decode(errors="replace")


def _context(namespace: str, name: str, sandbox_id: str) -> bytes:
    return "\0".join(("warmshell-activation-proof/v1", namespace, name, sandbox_id)).encode()
