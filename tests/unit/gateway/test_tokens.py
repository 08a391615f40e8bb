"""Sandbox JWTs and activation tokens."""

from __future__ import annotations

import stat
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import SandboxId
from warmshell.gateway.tokens import (
    SandboxTokenIssuer,
    load_or_create_api_token,
    new_activation_token,
    proof_matches,
)


def test_jwt_round_trip_and_pinned_algorithm() -> None:
    issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=60)
    token, expires = issuer.mint(SandboxId("sb"), "inst")
    claims = issuer.verify(token)
    assert (claims.sandbox_id, claims.instance_id, claims.expires_at_ms) == ("sb", "inst", expires)
    forged = jwt.encode({"sandbox_id": "sb", "aud": "warmshell-gateway:g"}, "s" * 64, algorithm="HS256")
    with pytest.raises(PermissionDeniedError):
        issuer.verify(forged)


def test_token_from_another_gateway_is_refused() -> None:
    ours = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=60)
    theirs = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=60)
    token, _ = theirs.mint(SandboxId("sb"), "i")
    with pytest.raises(PermissionDeniedError):
        ours.verify(token)


def test_activation_tokens_are_long_and_only_hash_matches() -> None:
    token, digest = new_activation_token()
    assert len(token) >= 22  # >= 128 bits of base64url
    assert token not in digest
    assert proof_matches(token, digest)
    assert not proof_matches(token + "x", digest)
    assert not proof_matches("", digest)


def test_api_token_file_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "state" / "api-token"
    first = load_or_create_api_token(path)
    assert load_or_create_api_token(path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
