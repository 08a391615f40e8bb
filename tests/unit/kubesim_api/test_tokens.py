"""Service-account JWTs: audiences, expiry, liveness of the bound objects, forgery."""

from __future__ import annotations

import jwt
import pytest

from kubesim.apiserver import tokens


def issue(issuer: tokens.TokenIssuer, **kw: object) -> str:
    token, _ = issuer.issue(
        namespace="ns",
        service_account="sa",
        sa_uid="sa-uid",
        audiences=["aud"],
        expiration_seconds=600,
        pod=("p", "pod-uid"),
        **kw,  # type: ignore[arg-type]
    )
    return token


def live(kind: str, ns: str, name: str) -> str | None:
    return {"ServiceAccount": "sa-uid", "Pod": "pod-uid"}.get(kind)


def test_valid_token() -> None:
    issuer = tokens.TokenIssuer()
    v = issuer.verify(issue(issuer), ["aud", "other"], live)
    assert v.username == "system:serviceaccount:ns:sa"
    assert v.audiences == ["aud"]
    assert v.extra["authentication.kubernetes.io/pod-name"] == ["p"]
    assert v.extra["authentication.kubernetes.io/pod-uid"] == ["pod-uid"]
    assert "system:serviceaccounts:ns" in v.groups


def test_wrong_audience_expiry_and_forgery() -> None:
    now = [1_000_000.0]
    issuer = tokens.TokenIssuer(clock=lambda: now[0])
    token = issue(issuer)
    with pytest.raises(tokens.TokenInvalid, match="audiences"):
        issuer.verify(token, ["else"], live)
    with pytest.raises(tokens.TokenInvalid):
        tokens.TokenIssuer().verify(token, ["aud"], live)  # another server's key
    now[0] += 601
    with pytest.raises(tokens.TokenInvalid, match="expired"):
        issuer.verify(token, ["aud"], live)


def test_bound_pod_gone_or_replaced() -> None:
    issuer = tokens.TokenIssuer()
    token = issue(issuer)
    with pytest.raises(tokens.TokenInvalid, match="deleted"):
        issuer.verify(token, ["aud"], lambda k, n, name: "sa-uid" if k == "ServiceAccount" else None)
    with pytest.raises(tokens.TokenInvalid, match="does not match"):
        issuer.verify(token, ["aud"], lambda k, n, name: "sa-uid" if k == "ServiceAccount" else "new-uid")


def test_jwks_verifies_issued_tokens_offline() -> None:
    issuer = tokens.TokenIssuer()
    token = issue(issuer)
    (key,) = issuer.jwks()["keys"]
    assert jwt.get_unverified_header(token)["kid"] == key["kid"]
    public = jwt.PyJWK(key).key
    claims = jwt.decode(token, public, algorithms=["EdDSA"], audience="aud", issuer=tokens.ISSUER)
    assert claims["sub"] == "system:serviceaccount:ns:sa"
    assert claims["kubernetes.io"]["pod"] == {"name": "p", "uid": "pod-uid"}
