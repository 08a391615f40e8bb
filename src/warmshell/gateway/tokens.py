"""Credentials the gateway issues: the client API token, sandbox JWTs (Ed25519) and the opaque
per-create activation tokens (kept only hashed). None of them is ever logged."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import SandboxId

__all__ = [
    "SandboxClaims",
    "SandboxTokenIssuer",
    "hash_secret",
    "load_or_create_api_token",
    "load_or_create_signing_key",
    "new_activation_token",
    "proof_matches",
]

# 192 bits: comfortably above the 128-bit floor for unguessable bearer secrets.
_ACTIVATION_TOKEN_BYTES = 24
_JWT_ALGORITHM = "EdDSA"
_JWT_LEEWAY_SECONDS = 30


def _write_private(path: Path, data: bytes) -> None:
    """Create a file readable only by its owner, atomically (no window with wider permissions)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def load_or_create_api_token(path: Path) -> str:
    """The client bearer token, created (0600) on first start."""
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(32)
    _write_private(path, token.encode() + b"\n")
    return token


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The sandbox-token signing key, created (0600, PEM) on first start."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_private(path, pem)
    return key


def hash_secret(secret: str) -> str:
    """SHA-256 hex of a high-entropy secret (no salt needed: the secrets are random)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_activation_token() -> tuple[str, str]:
    """A fresh activation token and its hash; only the hash is stored."""
    token = secrets.token_urlsafe(_ACTIVATION_TOKEN_BYTES)
    return token, hash_secret(token)


def proof_matches(proof: str, stored_hash: str) -> bool:
    """Constant-time check of a presented activation proof against the stored hash."""
    if not proof or not stored_hash:
        return False
    return hmac.compare_digest(hash_secret(proof), stored_hash)


@dataclass(frozen=True)
class SandboxClaims:
    """What a verified sandbox token says."""

    sandbox_id: SandboxId
    instance_id: str
    expires_at_ms: int
    # The supervisor incarnation it was minted for (`drivers.base.SupervisorIdentity`); -1 in a
    # token minted before tokens carried it.
    incarnation: int = -1


class SandboxTokenIssuer:
    """Mints and verifies the short-lived Ed25519 JWTs that supervisors present.

    A token this issuer minted is remembered (by its SHA-256, with its claims) until it expires:
    presented back, it is the exact string signed here, so only its expiry is checked; the
    signature check and PyJWT's decoding (a few per cent of a warm create's gateway CPU) are for
    tokens minted elsewhere (another replica, or before a restart) and for forgeries."""

    def __init__(self, key: Ed25519PrivateKey, *, gateway_id: str, ttl_seconds: int) -> None:
        self._key = key
        self._public: Ed25519PublicKey = key.public_key()
        self._audience = f"warmshell-gateway:{gateway_id}"
        self._ttl = ttl_seconds
        # In minting order, which is expiry order (one TTL for all): pruned from the front.
        self._minted: dict[str, SandboxClaims] = {}

    def _usable(self, claims: SandboxClaims, now: float) -> bool:
        # PyJWT's rule: refused once `exp <= now - leeway`.
        return claims.expires_at_ms > (now - _JWT_LEEWAY_SECONDS) * 1000

    def _remember(self, token: str, claims: SandboxClaims, now: float) -> None:
        while self._minted:
            oldest = next(iter(self._minted))
            if self._usable(self._minted[oldest], now):
                break
            del self._minted[oldest]
        self._minted[hash_secret(token)] = claims

    def mint(self, sandbox_id: SandboxId, instance_id: str, incarnation: int = -1) -> tuple[str, int]:
        """A token for that sandbox instance (and incarnation of its supervisor, which the
        session it opens records: the record need not be written at activation for a replay of
        that incarnation's credential to be refused once it has connected) and its expiry (unix ms)."""
        now = int(time.time())
        expires = now + self._ttl
        claims = {
            "sub": f"warmshell://sandbox/{sandbox_id}",
            "iss": self._audience,
            "aud": self._audience,
            "iat": now,
            "exp": expires,
            "sandbox_id": sandbox_id,
            "instance_id": instance_id,
            "incarnation": incarnation,
            "jti": secrets.token_hex(8),
        }
        token = jwt.encode(claims, self._key, algorithm=_JWT_ALGORITHM)
        self._remember(token, SandboxClaims(sandbox_id, instance_id, expires * 1000, incarnation), now)
        return token, expires * 1000

    def verify(self, token: str) -> SandboxClaims:
        """Check signature, audience, issuer and expiry; PermissionDeniedError otherwise."""
        minted = self._minted.get(hash_secret(token))
        if minted is not None and self._usable(minted, time.time()):
            return minted
        try:
            claims = jwt.decode(
                token,
                self._public,
                algorithms=[_JWT_ALGORITHM],  # pinned: never accept "none" or HMAC confusion
                audience=self._audience,
                issuer=self._audience,
                leeway=_JWT_LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "sub", "aud", "iss"]},
            )
        except jwt.PyJWTError as exc:
            raise PermissionDeniedError(f"invalid sandbox token: {exc}") from exc
        sandbox_id = claims.get("sandbox_id")
        if not isinstance(sandbox_id, str) or not sandbox_id:
            raise PermissionDeniedError("invalid sandbox token: no sandbox_id claim")
        incarnation = claims.get("incarnation", -1)
        if not isinstance(incarnation, int) or isinstance(incarnation, bool):
            raise PermissionDeniedError("invalid sandbox token: the incarnation claim is not an integer")
        return SandboxClaims(
            SandboxId(sandbox_id), str(claims.get("instance_id", "")), int(claims["exp"]) * 1000, incarnation
        )
