"""Service-account tokens: Ed25519-signed JWTs bound to an audience, an expiry and maybe a pod.

``TokenIssuer.issue`` backs the ``serviceaccounts/<name>/token`` subresource (TokenRequest);
``TokenIssuer.verify`` backs TokenReview and API authentication. A token stops verifying when it
expires, when the audience does not match, or when its service account or bound pod is gone or
has a different uid — the checks kube-apiserver's service-account authenticator makes.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ISSUER = "https://kubernetes.default.svc.cluster.local"
OIDC_DISCOVERY = {
    "issuer": "https://kubernetes.default.svc.cluster.local",
    "jwks_uri": "https://kubernetes.default.svc.cluster.local/openid/v1/jwks",
    "response_types_supported": ["id_token"],
    "subject_types_supported": ["public"],
    "id_token_signing_alg_values_supported": ["EdDSA"],
}
DEFAULT_AUDIENCES = [ISSUER, "https://kubernetes.default.svc"]
PREFIX = "authentication.kubernetes.io/"


class TokenInvalid(Exception):
    """The token does not authenticate; the message is what TokenReview reports."""


# (kind "ServiceAccount"|"Pod", namespace, name) -> uid of the live object, or None if gone.
Validator = Callable[[str, str, str], str | None]


@dataclass
class Verified:
    """The identity carried by a valid token."""

    username: str
    uid: str
    groups: list[str]
    audiences: list[str]
    extra: dict[str, list[str]] = field(default_factory=dict)


class TokenIssuer:
    """Signs and verifies service-account JWTs with one Ed25519 key per server."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._key = Ed25519PrivateKey.generate()
        self._public = self._key.public_key()
        self.clock = clock

    @property
    def key_id(self) -> str:
        """The ``kid`` of the signing key (a hash of the public key, as kube-apiserver derives it)."""
        raw = self._public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")

    def jwks(self) -> dict[str, Any]:
        """The JSON Web Key Set served at ``/openid/v1/jwks``."""
        raw = self._public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        x = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        return {"keys": [{"use": "sig", "kty": "OKP", "crv": "Ed25519", "kid": self.key_id, "alg": "EdDSA", "x": x}]}

    def public_key_pem(self) -> bytes:
        """The verification key, for anyone who wants to check tokens offline."""
        return self._public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def issue(
        self,
        *,
        namespace: str,
        service_account: str,
        sa_uid: str,
        audiences: list[str],
        expiration_seconds: int,
        pod: tuple[str, str] | None = None,
    ) -> tuple[str, int]:
        """Return (token, expiry as unix seconds)."""
        now = int(self.clock())
        exp = now + expiration_seconds
        k8s: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": sa_uid},
        }
        if pod is not None:
            k8s["pod"] = {"name": pod[0], "uid": pod[1]}
        claims = {
            "aud": audiences,
            "exp": exp,
            "iat": now,
            "nbf": now,
            "iss": ISSUER,
            "jti": str(uuid.uuid4()),
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "kubernetes.io": k8s,
        }
        return jwt.encode(claims, self._key, algorithm="EdDSA", headers={"kid": self.key_id}), exp

    def verify(self, token: str, audiences: list[str], validator: Validator | None) -> Verified:
        """Check signature, issuer, expiry, audience and (with ``validator``) liveness."""
        try:
            claims = jwt.decode(
                token,
                self._public,
                algorithms=["EdDSA"],
                issuer=ISSUER,
                options={"verify_aud": False, "verify_exp": False, "verify_nbf": False},
            )
        except jwt.PyJWTError as exc:
            raise TokenInvalid("invalid bearer token") from exc
        now = self.clock()
        if claims.get("exp", 0) < now:
            raise TokenInvalid("invalid bearer token, token has expired")
        token_aud = claims.get("aud") or []
        if isinstance(token_aud, str):
            token_aud = [token_aud]
        matched = [a for a in audiences if a in token_aud]
        if not matched:
            raise TokenInvalid(
                "invalid bearer token, token audiences "
                + str(token_aud)
                + " is invalid for the target audiences "
                + str(audiences)
            )
        k8s = claims.get("kubernetes.io") or {}
        ns = k8s.get("namespace", "")
        sa = k8s.get("serviceaccount") or {}
        extra: dict[str, list[str]] = {PREFIX + "credential-id": [f"JTI={claims.get('jti', '')}"]}
        if validator is not None:
            live = validator("ServiceAccount", ns, sa.get("name", ""))
            if live is None:
                raise TokenInvalid(f"service account {ns}/{sa.get('name')} has been deleted")
            if live != sa.get("uid"):
                raise TokenInvalid(f"service account UID ({sa.get('uid')}) does not match claim ({live})")
        pod = k8s.get("pod")
        if pod is not None:
            if validator is not None:
                live = validator("Pod", ns, pod.get("name", ""))
                if live is None:
                    raise TokenInvalid(f"pod {pod.get('name')} has been deleted")
                if live != pod.get("uid"):
                    raise TokenInvalid(f"pod UID ({live}) does not match claim ({pod.get('uid')})")
            extra[PREFIX + "pod-name"] = [pod.get("name", "")]
            extra[PREFIX + "pod-uid"] = [pod.get("uid", "")]
        return Verified(
            username=claims.get("sub", ""),
            uid=sa.get("uid", ""),
            groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
            audiences=matched,
            extra=extra,
        )
