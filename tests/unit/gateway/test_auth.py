"""Principals: a bootstrap credential may only register a supervisor."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import SandboxId
from warmshell.drivers.fake import FakeDriver
from warmshell.gateway.auth import Authenticator, Unauthenticated
from warmshell.gateway.tokens import SandboxTokenIssuer


class Context:
    """The one part of a grpc.aio ServicerContext the authenticator reads."""

    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


@pytest.fixture
def setup() -> tuple[Authenticator, FakeDriver, SandboxTokenIssuer]:
    driver = FakeDriver()
    issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="g", ttl_seconds=600)
    return Authenticator(api_token="api-token", issuer=issuer, identity=driver.identity), driver, issuer


async def test_bootstrap_credential_is_refused_on_the_public_and_session_apis(
    setup: tuple[Authenticator, FakeDriver, SandboxTokenIssuer],
) -> None:
    auth, driver, _ = setup
    credential = driver.add_warm_instance()
    with pytest.raises(PermissionDeniedError, match="may only register supervisors"):
        await auth.require_client(Context(credential))  # type: ignore[arg-type]
    with pytest.raises(PermissionDeniedError, match="may only register supervisors"):
        await auth.require_sandbox(Context(credential))  # type: ignore[arg-type]


async def test_each_principal_only_on_its_own_apis(setup: tuple[Authenticator, FakeDriver, SandboxTokenIssuer]) -> None:
    auth, _, issuer = setup
    await auth.require_client(Context("api-token"))  # type: ignore[arg-type]
    token, _ = issuer.mint(SandboxId("sb"), "i")
    assert (await auth.require_sandbox(Context(token))).sandbox_id == "sb"  # type: ignore[arg-type]
    with pytest.raises(PermissionDeniedError):
        await auth.require_client(Context(token))  # type: ignore[arg-type]
    with pytest.raises(PermissionDeniedError):
        await auth.require_sandbox(Context("api-token"))  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated):
        await auth.require_client(Context(""))  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated):
        await auth.require_client(Context("guess"))  # type: ignore[arg-type]


async def test_presenting_a_bootstrap_credential_on_other_rpcs_has_no_effect(
    setup: tuple[Authenticator, FakeDriver, SandboxTokenIssuer],
) -> None:
    """Classifying a credential is pure: refusing it on the public or session API registers nothing."""
    auth, driver, _ = setup
    credential = driver.add_warm_instance()
    for _ in range(3):
        with pytest.raises(PermissionDeniedError):
            await auth.require_client(Context(credential))  # type: ignore[arg-type]
        with pytest.raises(PermissionDeniedError):
            await auth.require_sandbox(Context(credential))  # type: ignore[arg-type]
    assert driver.identity.registrations == []
