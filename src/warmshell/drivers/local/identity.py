"""Who is this supervisor? The local driver's answer, from the bootstrap credential it handed out.

Fail-closed: a `wsl1.` credential that is malformed, unknown, mismatched, or belongs to an
instance that ended or is being deleted is refused with the same message, so a caller learns
nothing about which instances exist.
"""

from __future__ import annotations

from collections.abc import Callable

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import InstanceId
from warmshell.drivers.base import SupervisorIdentity
from warmshell.drivers.local import credentials
from warmshell.drivers.local.instances import Instance

__all__ = ["LocalIdentity"]

# Compared against when the instance is unknown, so that case costs the same as a mismatch.
_DUMMY_DIGEST = "0" * 64


class LocalIdentity:
    """An `IdentityProvider` over the driver's live instances."""

    def __init__(
        self,
        lookup: Callable[[InstanceId], Instance | None],
        on_registered: Callable[[Instance], None],
    ) -> None:
        self._lookup = lookup
        self._on_registered = on_registered

    async def authenticate(self, credential: str) -> SupervisorIdentity | None:
        """The identity behind a local credential; None when the credential is not ours. Pure."""
        if not credential.startswith(credentials.PREFIX):
            return None
        instance_id = credentials.instance_of(credential)
        instance = self._lookup(instance_id) if instance_id is not None else None
        expected = instance.credential_digest if instance is not None else _DUMMY_DIGEST
        ok = credentials.matches(credential, expected)
        if instance is None or not ok or not instance.alive:
            raise PermissionDeniedError("local bootstrap credential rejected")
        return SupervisorIdentity(
            driver="local",
            instance_id=instance.instance_id,
            instance_name=instance.name or instance.instance_id,
            workspace=instance.workspace,
            binding=instance.binding(),
        )

    def registered(self, identity: SupervisorIdentity) -> None:
        """A registration of this instance was accepted: tell the driver (once per registration)."""
        instance = self._lookup(identity.instance_id)
        if instance is not None and instance.alive:
            self._on_registered(instance)
