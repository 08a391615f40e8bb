"""An in-memory ComputeDriver for tests and benchmarks of the gateway (like httpx's MockTransport).

Nothing runs: `create` records the sandbox and, when a handler says so, fails or goes warm by
activating one of the pending instances registered with `add_warm_instance`. Its identity provider
accepts only the credentials it handed out (`fake.<instance>.<secret>`).
"""

from __future__ import annotations

import asyncio
import builtins
import hmac
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import Fingerprint, InstanceId, SandboxId
from warmshell.core.models import Allocation, SandboxSpec, now_us
from warmshell.drivers.base import (
    Activator,
    BackendState,
    Bound,
    CreateRequest,
    DriverEvent,
    DriverSandbox,
    PoolView,
    SupervisorIdentity,
    WarmPending,
)

__all__ = ["FakeDriver", "FakeIdentity"]

CREDENTIAL_PREFIX = "fake."


@dataclass
class _Instance:
    instance_id: InstanceId
    secret: str
    workspace: str
    binding: Bound | WarmPending


@dataclass
class FakeIdentity:
    """Identity provider over the fake driver's instances."""

    instances: dict[InstanceId, _Instance] = field(default_factory=dict)
    registrations: list[InstanceId] = field(default_factory=list)

    async def authenticate(self, credential: str) -> SupervisorIdentity | None:
        """Resolve `fake.<instance>.<secret>`; None for anything else."""
        if not credential.startswith(CREDENTIAL_PREFIX):
            return None
        _, instance_id, secret = [*credential.split(".", 2), "", ""][:3]
        instance = self.instances.get(InstanceId(instance_id))
        if instance is None or not hmac.compare_digest(instance.secret, secret):
            raise PermissionDeniedError("unknown fake credential")
        return SupervisorIdentity("fake", instance.instance_id, instance_id, instance.workspace, instance.binding)

    def registered(self, identity: SupervisorIdentity) -> None:
        """Count accepted registrations (tests check that only RegisterSupervisor adds one)."""
        self.registrations.append(identity.instance_id)


class FakeDriver:
    """See the module docstring. `handler(request)` may raise to simulate a backend failure."""

    name = "fake"

    def __init__(self, handler: Callable[[CreateRequest], None] | None = None) -> None:
        self._handler = handler
        self._identity = FakeIdentity()
        self._sandboxes: dict[SandboxId, DriverSandbox] = {}
        self._events: asyncio.Queue[DriverEvent] = asyncio.Queue()
        self._activator: Activator | None = None
        self.pool = Fingerprint("fake-pool")

    @property
    def identity(self) -> FakeIdentity:
        """The fake identity provider."""
        return self._identity

    def add_warm_instance(self, workspace: str = "default") -> str:
        """Register a pending pool member; returns the credential its 'supervisor' would present."""
        instance_id = InstanceId(f"fake-{secrets.token_hex(6)}")
        secret = secrets.token_urlsafe(16)
        self._identity.instances[instance_id] = _Instance(instance_id, secret, workspace, WarmPending(self.pool))
        return f"{CREDENTIAL_PREFIX}{instance_id}.{secret}"

    async def __aenter__(self) -> FakeDriver:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self, activator: Activator) -> None:
        """Keep the activator for warm creates."""
        self._activator = activator

    def default_image(self) -> str:
        """The fake's default image."""
        return ""

    def validate(self, workspace: str, spec: SandboxSpec) -> SandboxSpec:
        """Accept everything, as asked."""
        return spec

    async def create(self, request: CreateRequest) -> DriverSandbox:
        """Record the sandbox; go warm when a pending instance of its workspace exists."""
        if self._handler is not None:
            self._handler(request)
        for instance in self._identity.instances.values():
            if isinstance(instance.binding, WarmPending) and instance.workspace == request.workspace:
                assert self._activator is not None
                instance.binding = Bound(request.sandbox_id, request.activation_proof)
                await self._activator.activate(
                    instance_id=instance.instance_id,
                    sandbox_id=request.sandbox_id,
                    proof=request.activation_proof,
                    reason="fake pool",
                )
                return self._store(request.sandbox_id, instance.instance_id, Allocation.WARM, self.pool)
        return self._store(request.sandbox_id, InstanceId(f"fake-{request.sandbox_id[:8]}"), Allocation.COLD, "")

    def _store(self, sandbox_id: SandboxId, instance_id: str, allocation: Allocation, pool: str) -> DriverSandbox:
        now = now_us()
        view = DriverSandbox(
            sandbox_id,
            instance_id,
            BackendState.RUNNING,
            allocation=allocation,
            pool=pool,
            created_us=now,
            claimed_us=now if allocation == Allocation.WARM else 0,
        )
        self._sandboxes[sandbox_id] = view
        return view

    async def get(self, sandbox_id: SandboxId) -> DriverSandbox | None:
        """The recorded view."""
        return self._sandboxes.get(sandbox_id)

    async def list(self) -> builtins.list[DriverSandbox]:
        """Every recorded sandbox."""
        return builtins.list(self._sandboxes.values())

    async def delete(self, sandbox_id: SandboxId) -> bool:
        """Forget the sandbox."""
        return self._sandboxes.pop(sandbox_id, None) is not None

    async def watch(self) -> AsyncIterator[DriverEvent]:
        """Events pushed with `emit` (none by default)."""
        while True:
            yield await self._events.get()

    def emit(self, event: DriverEvent) -> None:
        """Push an event to the gateway's watch loop."""
        self._events.put_nowait(event)

    def pools(self) -> builtins.list[PoolView]:
        """No pool views."""
        return []

    async def aclose(self) -> None:
        """Nothing to release."""
