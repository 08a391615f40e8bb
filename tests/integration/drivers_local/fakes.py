"""In-process stand-ins for the gateway side: an Activator and "supervisors registering"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from warmshell.core.errors import AlreadyExistsError, NotFoundError, PermissionDeniedError
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.drivers.local import LocalDriver


@dataclass(frozen=True)
class Activation:
    instance_id: InstanceId
    sandbox_id: SandboxId
    proof: str
    reason: str


@dataclass
class FakeActivator:
    """Like the gateway's: only registered instances activate, each at most once; tests can
    make chosen instances fail."""

    registered: set[InstanceId] = field(default_factory=set)
    calls: list[Activation] = field(default_factory=list)
    failures: dict[InstanceId, Exception] = field(default_factory=dict)
    _activated: set[InstanceId] = field(default_factory=set)

    async def activate(
        self, *, instance_id: InstanceId, sandbox_id: SandboxId, proof: str, reason: str, claimed_us: int = 0
    ) -> None:
        self.calls.append(Activation(instance_id, sandbox_id, proof, reason))
        if instance_id in self.failures:
            raise self.failures[instance_id]
        if instance_id not in self.registered:
            raise NotFoundError(f"instance {instance_id} is not registered")
        if instance_id in self._activated:
            raise AlreadyExistsError(f"instance {instance_id} was already activated")
        self._activated.add(instance_id)


async def _register_loop(driver: LocalDriver, sandboxes: Path, activator: FakeActivator) -> None:
    seen: set[Path] = set()
    while True:
        for credential in sandboxes.glob("*/workspace/credential"):
            if credential in seen:
                continue
            seen.add(credential)
            with contextlib.suppress(PermissionDeniedError, OSError):
                identity = await driver.identity.authenticate(credential.read_text())
                if identity is not None:
                    driver.identity.registered(identity)  # what RegisterSupervisor does next
                    activator.registered.add(identity.instance_id)
        await asyncio.sleep(0.005)  # a scan interval, not a wait for a condition


@contextlib.asynccontextmanager
async def registering(driver: LocalDriver, sandboxes: Path, activator: FakeActivator) -> AsyncIterator[None]:
    """While active, every stand-in supervisor that wrote its credential "registers": the
    driver's identity provider authenticates it and the activator learns about it."""
    task = asyncio.create_task(_register_loop(driver, sandboxes, activator))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
