"""Local warm pools: for each profile, keep `replicas` idle supervisors spawned and registered.

The driver owns processes; this module decides how many to spawn, which one a create gets, and
what happens when profiles change: a profile changed in anything but `replicas` becomes a new
pool (the old one's idle members are stopped), a removed profile drains its pool, and an invalid
file is reported on its pool without touching the others (the last valid version keeps serving).
A member that dies before registering counts as a failure; the pool then backs off
exponentially instead of respawning in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from warmshell.core import poolshapes
from warmshell.core.errors import InvalidArgumentError, WarmshellError
from warmshell.core.fingerprints import SandboxShape
from warmshell.core.ids import Fingerprint
from warmshell.core.matching import MatchResult, PoolIndex
from warmshell.core.models import Resources, SandboxSpec
from warmshell.core.profiles import Profile, ProfileError
from warmshell.drivers.base import DriverCondition, PoolView, invalid_profile_view
from warmshell.drivers.local.instances import Instance

__all__ = ["Pool", "PoolSet"]

_log = logging.getLogger(__name__)
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0


@dataclass(eq=False)
class Pool:
    """One profile's pool: its idle members (spawned, not yet claimed) and counters."""

    profile: Profile
    fingerprint: Fingerprint
    members: list[Instance] = field(default_factory=list)
    spawning: int = 0
    hits: int = 0
    misses: int = 0
    failures: int = 0
    retry_at: float = 0.0
    conditions: tuple[DriverCondition, ...] = ()
    retired: bool = False

    @property
    def name(self) -> str:
        """The profile's name (its file stem)."""
        return self.profile.name

    @property
    def spec(self) -> SandboxSpec:
        """What members are spawned with (env and resources only shape the fingerprint and
        the limits; the request's own env reaches the workload in the activation)."""
        return SandboxSpec(
            image=self.profile.image,
            environment=dict(self.profile.environment),
            resources=Resources(cpu=self.profile.cpu, memory=self.profile.memory, pids=self.profile.pids),
            runtime_class_name=self.profile.runtime_class_name,
            storage=self.profile.storage,
        )

    def claim(self) -> Instance | None:
        """Take the oldest registered idle member out of the pool (it never comes back)."""
        for index, member in enumerate(self.members):
            if member.registered and member.alive:
                return self.members.pop(index)
        return None

    def view(self, extra: tuple[DriverCondition, ...] = ()) -> PoolView:
        """How `warmshell pool list` shows it."""
        profile = self.profile
        claimable = sum(1 for m in self.members if m.registered and m.alive)
        return PoolView(
            name=profile.name,
            workspace=profile.workspace,
            fingerprint=self.fingerprint,
            image=profile.image,
            environment=dict(profile.environment),
            cpu=profile.cpu,
            memory=profile.memory,
            pids=profile.pids,
            desired=profile.replicas,
            # ready: registered, so claimable now; idle: ready and not claimed. A claimed member
            # leaves the pool at once, so locally the two coincide (desired - ready are booting).
            ready=claimable,
            idle=claimable,
            hits=self.hits,
            misses=self.misses,
            source=profile.source,
            conditions=self.conditions + extra,
            accepted_environment=profile.accepted_environment,
            ttl_seconds=profile.ttl_seconds,
            idle_timeout_seconds=profile.idle_timeout_seconds,
        )


def _invalid(error: InvalidArgumentError) -> DriverCondition:
    return DriverCondition("ProfileValid", "False", "InvalidProfile", str(error))


class PoolSet:
    """Every pool of the driver, the fingerprint index over them, and the refill loop."""

    def __init__(
        self,
        *,
        spawn: Callable[[Pool], Awaitable[Instance]],
        stop: Callable[[Instance], Coroutine[Any, Any, None]],
        default_image: str,
        validate: Callable[[Profile], None],
        max_concurrent_spawns: int = 8,
    ) -> None:
        self._spawn_member = spawn
        self._stop_member = stop
        self._default_image = default_image
        self._validate = validate
        self._slots = asyncio.Semaphore(max_concurrent_spawns)
        self._pools: dict[str, Pool] = {}
        self._errors: dict[str, InvalidArgumentError] = {}
        self._shared: dict[str, tuple[str, ...]] = {}  # pool -> the other pools of its shape
        self._index: PoolIndex[Pool] = PoolIndex(None)
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    # -- lookups ---------------------------------------------------------------------------

    def lookup(self, fp: Fingerprint) -> MatchResult[Pool]:
        """Which pools serve this fingerprint (NotReady until the first `apply`)."""
        return self._index.lookup(fp)

    def match(self, shape: SandboxShape) -> MatchResult[Pool]:
        """Which pools serve a request of this shape, their accepted keys left out of it."""
        return self._index.match(shape)

    def views(self) -> list[PoolView]:
        """Every pool, plus a view of each invalid profile that has no valid version running."""
        views = [
            pool.view((_invalid(self._errors[name]),) if name in self._errors else self._shared_shape(pool))
            for name, pool in sorted(self._pools.items())
        ]
        for name, error in sorted(self._errors.items()):
            if name not in self._pools:
                views.append(_invalid_view(name, error))
        return views

    def _shared_shape(self, pool: Pool) -> tuple[DriverCondition, ...]:
        others = self._shared.get(pool.name)
        if not others:
            return ()
        message = poolshapes.shared_shape_message(others, pool.fingerprint)
        return (DriverCondition(poolshapes.CONDITION_TYPE, "False", poolshapes.REASON, message),)

    # -- profile changes -------------------------------------------------------------------

    def apply(self, profiles: Mapping[str, Profile], errors: Mapping[str, ProfileError]) -> None:
        """Make the pools match the profiles just read (the whole directory)."""
        self._errors = dict(errors)
        for name, profile in profiles.items():
            try:
                self._validate(profile)
            except InvalidArgumentError as exc:
                self._errors[name] = exc
                continue
            self._upsert(profile)
        for name in [n for n in self._pools if n not in profiles and n not in errors]:
            _log.info("warm pool %s: profile removed, draining", name)
            self._retire(self._pools.pop(name))
        self._index = PoolIndex(
            ((pool.fingerprint, pool) for pool in self._pools.values()),
            accepts=lambda pool: pool.profile.accepted_environment,
        )
        self._shared = poolshapes.shared_shapes((name, pool.fingerprint) for name, pool in self._pools.items())
        for name, error in self._errors.items():
            _log.warning("warm pool %s: invalid profile: %s", name, error)
        for name, others in sorted(self._shared.items()):
            message = poolshapes.shared_shape_message(others, self._pools[name].fingerprint)
            _log.warning("warm pool %s: %s", name, message)
        self.wake()

    def _upsert(self, profile: Profile) -> None:
        old = self._pools.get(profile.name)
        if old is not None and old.profile.same_pool(profile):
            old.profile = profile  # replicas (or nothing) changed: members stay
            return
        pool = Pool(profile, profile.fingerprint(self._default_image))
        if old is not None:
            _log.info("warm pool %s: profile changed, replacing idle members", profile.name)
            pool.hits, pool.misses = old.hits, old.misses
            self._retire(old)
        self._pools[profile.name] = pool

    def _retire(self, pool: Pool) -> None:
        pool.retired = True
        members, pool.members = pool.members, []
        for member in members:
            self._background(self._stop_member(member))

    # -- member lifecycle ------------------------------------------------------------------

    def member_registered(self, member: Instance) -> None:
        """A member's supervisor registered: it can be claimed; the pool is healthy again."""
        pool = self._pools.get(member.pool_name)
        if pool is not None and member in pool.members:
            pool.failures = 0
            pool.conditions = ()

    def member_ended(self, member: Instance, message: str) -> None:
        """An idle member's process ended on its own: forget it, refill (with backoff if it
        never registered)."""
        pool = self._pools.get(member.pool_name)
        if pool is None or member not in pool.members:
            return
        pool.members.remove(member)
        if not member.registered:
            self._failed(pool, message)
        self.wake()

    def _failed(self, pool: Pool, message: str) -> None:
        pool.failures += 1
        delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** (pool.failures - 1))
        pool.retry_at = asyncio.get_running_loop().time() + delay
        pool.conditions = (DriverCondition("MembersHealthy", "False", "MemberFailed", message),)
        _log.warning(
            "warm pool %s: member failed (%d in a row), retrying in %.1fs: %s",
            pool.name,
            pool.failures,
            delay,
            message,
        )

    # -- the refill loop -------------------------------------------------------------------

    def wake(self) -> None:
        """Ask the refill loop to look at every pool again."""
        self._wake.set()

    def start(self) -> None:
        """Run the refill loop."""
        self._runner = asyncio.create_task(self._run(), name="local-pools")

    async def aclose(self) -> None:
        """Stop refilling and stop every idle member."""
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
        for pool in self._pools.values():
            self._retire(pool)
        # Spawns in flight finish and, seeing their pool retired, stop what they spawned.
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._refill()

    def _refill(self) -> None:
        now = asyncio.get_running_loop().time()
        next_retry: float | None = None
        for pool in self._pools.values():
            if pool.retry_at > now:
                next_retry = pool.retry_at if next_retry is None else min(next_retry, pool.retry_at)
                continue
            missing = pool.profile.replicas - len(pool.members) - pool.spawning
            for _ in range(missing):
                pool.spawning += 1
                self._background(self._spawn(pool))
            if missing < 0:
                # Fewer replicas now: stop the youngest (least likely registered) members.
                extra, pool.members = pool.members[missing:], pool.members[:missing]
                for member in extra:
                    self._background(self._stop_member(member))
        if next_retry is not None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(next_retry, self._wake.set)

    async def _spawn(self, pool: Pool) -> None:
        try:
            async with self._slots:
                if pool.retired:
                    return
                member = await self._spawn_member(pool)
        except (WarmshellError, OSError) as exc:
            self._failed(pool, str(exc))
        else:
            if pool.retired:
                await self._stop_member(member)
            else:
                pool.members.append(member)
        finally:
            pool.spawning -= 1
            self.wake()

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _invalid_view(name: str, error: InvalidArgumentError) -> PoolView:
    source = error.source if isinstance(error, ProfileError) else ""
    return invalid_profile_view(name, source=source, message=str(error))
