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


def test_a_token_minted_here_is_verified_without_decoding_it(monkeypatch: pytest.MonkeyPatch) -> None:
    issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=60)
    token, expires = issuer.mint(SandboxId("sb"), "inst")

    def no_decoding(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("decoded a token this issuer minted")

    monkeypatch.setattr(jwt, "decode", no_decoding)
    claims = issuer.verify(token)
    assert (claims.sandbox_id, claims.instance_id, claims.expires_at_ms) == ("sb", "inst", expires)


def test_a_tampered_copy_of_a_minted_token_is_refused() -> None:
    issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=60)
    token, _ = issuer.mint(SandboxId("sb"), "inst")
    header, payload, signature = token.split(".")
    other = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=60)
    _, other_payload, _ = other.mint(SandboxId("other"), "inst")[0].split(".")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    for forged in (f"{header}.{payload}.{flipped}", f"{header}.{other_payload}.{signature}", token + "x"):
        with pytest.raises(PermissionDeniedError):
            issuer.verify(forged)


def test_a_token_minted_by_another_replica_with_the_same_key_is_verified_by_signature() -> None:
    key = Ed25519PrivateKey.generate()
    ours = SandboxTokenIssuer(key, gateway_id="g", ttl_seconds=60)
    theirs = SandboxTokenIssuer(key, gateway_id="g", ttl_seconds=60)
    token, expires = theirs.mint(SandboxId("sb"), "inst")
    assert ours.verify(token).expires_at_ms == expires


def test_a_minted_token_expires_like_any_other_and_is_then_forgotten() -> None:
    key = Ed25519PrivateKey.generate()
    # A negative TTL mints tokens that are already that old: within PyJWT's 30 s leeway, then past it.
    within = SandboxTokenIssuer(key, gateway_id="g", ttl_seconds=-25)
    assert within.verify(within.mint(SandboxId("sb"), "inst")[0]).sandbox_id == "sb"
    past = SandboxTokenIssuer(key, gateway_id="g", ttl_seconds=-35)
    token, _ = past.mint(SandboxId("sb"), "inst")
    with pytest.raises(PermissionDeniedError, match="expired"):
        past.verify(token)
    past.mint(SandboxId("sb2"), "inst")
    assert len(past._minted) == 1  # the expired one was dropped when the next was minted


def test_a_token_carries_its_supervisor_incarnation_and_an_older_token_none() -> None:
    key = Ed25519PrivateKey.generate()
    ours = SandboxTokenIssuer(key, gateway_id="g", ttl_seconds=60)
    theirs = SandboxTokenIssuer(key, gateway_id="g", ttl_seconds=60)
    token, _ = theirs.mint(SandboxId("sb"), "inst", 3)
    assert ours.verify(token).incarnation == theirs.verify(token).incarnation == 3
    # A token of a gateway from before the claim (the claims a mint then wrote, re-signed).
    older = jwt.decode(token, options={"verify_signature": False})
    del older["incarnation"]
    assert ours.verify(jwt.encode(older, key, algorithm="EdDSA")).incarnation == -1
    older["incarnation"] = "3"
    with pytest.raises(PermissionDeniedError, match="incarnation"):
        ours.verify(jwt.encode(older, key, algorithm="EdDSA"))
