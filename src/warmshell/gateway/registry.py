"""Pending supervisor registrations, keyed by instance id.

Each registration gets a session id. A newer registration of the same instance replaces the older
one (whose stream is told why); a stream that drops removes only its own session; an activated
instance leaves a tombstone for a while so a duplicate cannot be activated twice, and a fresh
registration after a restart supersedes the tombstone. In memory and per gateway replica: a
gateway restart loses nothing here, because every supervisor re-registers.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from warmshell.core.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    WarmshellError,
)
from warmshell.core.ids import InstanceId, SessionId
from warmshell.core.models import now_us
from warmshell.drivers.base import SupervisorIdentity, WarmPending

__all__ = ["Registration", "Registry", "Replaced"]

T = TypeVar("T")

DEFAULT_TOMBSTONE_TTL_SECONDS = 3600.0


@dataclass(frozen=True)
class Replaced:
    """Sent down a registration's stream when a newer registration of its instance arrives."""

    reason: str = "replaced by a newer registration of the same instance"


@dataclass(eq=False)
class Registration(Generic[T]):
    """One open RegisterSupervisor stream. The handler awaits `next_outcome()`."""

    identity: SupervisorIdentity
    session_id: SessionId
    registered_us: int
    # The IP address the registration came from ("" over a Unix socket or in process): a pod's,
    # to which its egress proxy credential is bound.
    peer: str = ""
    _outcome: asyncio.Queue[T | Replaced | WarmshellError] = field(default_factory=lambda: asyncio.Queue(1))
    closed: bool = False

    async def next_outcome(self) -> T | Replaced | WarmshellError:
        """Wait for the activation, a replacement notice, or a failure."""
        return await self._outcome.get()

    def _deliver(self, item: T | Replaced | WarmshellError) -> bool:
        if self.closed:
            return False
        try:
            self._outcome.put_nowait(item)
        except asyncio.QueueFull:
            return False
        return True


class Registry(Generic[T]):
    """The gateway's registry of registered, not-yet-activated supervisors."""

    def __init__(
        self,
        *,
        tombstone_ttl_seconds: float = DEFAULT_TOMBSTONE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pending: dict[InstanceId, Registration[T]] = {}
        # One TTL and a monotonic clock: tombstones expire in the order they were laid.
        self._tombstones: OrderedDict[InstanceId, float] = OrderedDict()
        self._ttl = tombstone_ttl_seconds
        self._clock = clock
        self._sessions = itertools.count(1)
        self._changed = asyncio.Event()
        self.generation = 0

    def register(self, identity: SupervisorIdentity, *, peer: str = "") -> Registration[T]:
        """Park a registration (from IP address `peer`, if any); replaces (and notifies) an
        older one of the same instance."""
        if not identity.instance_id:
            raise PermissionDeniedError("a registration needs an instance id")
        self._prune()
        self._tombstones.pop(identity.instance_id, None)
        previous = self._pending.pop(identity.instance_id, None)
        if previous is not None:
            previous._deliver(Replaced())
        registration: Registration[T] = Registration(
            identity=identity,
            session_id=SessionId(f"{identity.instance_id}/{next(self._sessions)}"),
            registered_us=now_us(),
            peer=peer,
        )
        self._pending[identity.instance_id] = registration
        self._bump()
        return registration

    def remove_if_session(self, instance_id: InstanceId, session_id: SessionId) -> None:
        """Forget a registration whose stream ended, unless it has been replaced meanwhile."""
        registration = self._pending.get(instance_id)
        if registration is not None and registration.session_id == session_id:
            registration.closed = True
            del self._pending[instance_id]
            self._bump()

    def pending(self, instance_id: InstanceId) -> Registration[T]:
        """The live registration of an instance; AlreadyExistsError if it was activated,
        NotFoundError if it is not registered."""
        self._prune()
        if instance_id in self._tombstones:
            raise AlreadyExistsError(f"instance {instance_id} has already been activated")
        registration = self._pending.get(instance_id)
        if registration is None:
            raise NotFoundError(f"instance {instance_id} is not registered")
        return registration

    def activate_if_session(self, instance_id: InstanceId, session_id: SessionId, activation: T) -> None:
        """Hand `activation` to the registration if it is still the given session.

        ConflictError when the registration was replaced; UnavailableError (and no tombstone)
        when its stream has already closed, so a fresh registration can be activated."""
        registration = self.pending(instance_id)
        if registration.session_id != session_id:
            raise ConflictError(f"registration of instance {instance_id} was replaced")
        del self._pending[instance_id]
        self._tombstones[instance_id] = self._clock() + self._ttl
        if not registration._deliver(activation):
            del self._tombstones[instance_id]
            self._bump()
            raise UnavailableError(f"registration stream of instance {instance_id} has closed")
        registration.closed = True
        self._bump()

    def fail_if_session(self, instance_id: InstanceId, session_id: SessionId, error: WarmshellError) -> None:
        """End a registration's stream with an error, if it is still that session."""
        registration = self._pending.get(instance_id)
        if registration is None or registration.session_id != session_id:
            return
        del self._pending[instance_id]
        registration._deliver(error)
        registration.closed = True
        self._bump()

    def close_all(self, reason: str) -> None:
        """Gateway shutdown: end every parked stream with UNAVAILABLE so supervisors register
        again with the next gateway (and the server's drain does not wait on them)."""
        for registration in list(self._pending.values()):
            registration._deliver(UnavailableError(reason))
            registration.closed = True
        self._pending.clear()
        self._bump()

    def holds(self, instance_id: InstanceId) -> bool:
        """Whether `instance_id` has a registration waiting here (an activated one has none)."""
        return instance_id in self._pending

    def pending_count(self) -> int:
        """How many registrations are parked."""
        return len(self._pending)

    def warm_pending(self) -> list[Registration[T]]:
        """Registrations of pool members waiting for a create."""
        return [r for r in self._pending.values() if isinstance(r.identity.binding, WarmPending)]

    def is_tombstoned(self, instance_id: InstanceId) -> bool:
        """Whether the instance was activated within the tombstone TTL."""
        self._prune()
        return instance_id in self._tombstones

    async def wait_changed(self, generation: int) -> int:
        """Block until the registry changed after `generation`; returns the new generation."""
        while self.generation == generation:
            await self._changed.wait()
        return self.generation

    def _bump(self) -> None:
        self.generation += 1
        # One event per generation: setting it wakes every waiter, and new waiters get a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()

    def _prune(self) -> None:
        """Forget expired tombstones: only those at the front, the oldest, are looked at (it
        runs on every registration and activation, with up to a TTL's worth of tombstones)."""
        now = self._clock()
        tombstones = self._tombstones
        while tombstones:
            oldest = next(iter(tombstones))
            if tombstones[oldest] > now:
                return
            del tombstones[oldest]
