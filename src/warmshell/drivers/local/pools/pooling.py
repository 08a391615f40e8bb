"""Local warm pools: for each profile, keep `replicas` idle members spawned and registered, and
hand them to creates.

Processes are the fleet's: pools start and stop members through an injected `Members` (see
`members`) and never call back into the driver. This module decides how many to spawn and when
(the refill rule: `PoolSet._refill`), which member a create's claim gets (`Claim`; the loop that
activates it is the driver's), whether idle members still answer, and what happens when profiles
change: a profile changed in anything but `replicas` becomes a new pool (the old one's idle
members are stopped), a removed profile drains its pool, and an invalid file is reported on its
pool without touching the others (the last valid version keeps serving). A member that dies
before registering counts as a failure; the pool then backs off exponentially instead of
respawning in a tight loop. Idle members are pinged every `check_seconds` and before a claim; one
that does not answer within `probe_seconds` is spent (stopped, replaced).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from warmshell.core import poolshapes
from warmshell.core.backoff import doubling_delay
from warmshell.core.errors import InvalidArgumentError, WarmshellError
from warmshell.core.fingerprints import SandboxShape
from warmshell.core.ids import Fingerprint
from warmshell.core.matching import MatchResult, PoolIndex
from warmshell.core.models import SandboxSpec
from warmshell.core.profiles import Profile, ProfileError
from warmshell.drivers.base import DriverCondition, PoolView, invalid_profile_view
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.pools import preparing

__all__ = ["Claim", "Members", "Pool", "PoolSet"]

_log = logging.getLogger(__name__)
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0
# Claims closer together than this are one run of creates, which refills keep out of the way of.
_BUSY_SECONDS = 0.1
# Member starts in flight while creates come one at a time. One was too few once a warm create
# took ~3 ms: a client creating back to back drained a pool of 10 (27-31 of 500 creates went
# cold), because one start (bwrap, the agent's hello, its registration) takes longer than a
# create and its delete. A burst still gets one: every start's event-loop share (~1 ms) is taken
# from the burst's creates, which are bound by that loop.
_SPAWNS_WHILE_BUSY = 2
# Members a claim probes before the create goes cold (the others are checked in the background).
_PROBES_PER_CLAIM = 2
# Idle members a liveness check pings at once. All of a pool of 1,000 at once held the event loop
# for tens of milliseconds (a task, a send and a timer each, then the answers), stalling the
# creates that arrived meanwhile, and woke 1,000 agents together.
_CHECK_SLICE = 16


class Members(Protocol):
    """How pools start and stop their members' processes."""

    async def spawn(self, pool: Pool) -> Instance:
        """Start a new idle member of `pool` (WarmshellError or OSError when it cannot)."""
        ...

    async def stop(self, member: Instance) -> None:
        """Stop a member and remove what it made."""
        ...


@dataclass(eq=False)
class Pool:
    """One profile's pool: its idle members (spawned, not yet claimed) and counters."""

    profile: Profile
    fingerprint: Fingerprint
    members: list[Instance] = field(default_factory=list)
    # The instance ids of the registered ones among `members`, kept as members come, register
    # and go, so that a view costs nothing per member (a pool of a thousand is listed often).
    ready: set[str] = field(default_factory=set)
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

    @functools.cached_property
    def spec(self) -> SandboxSpec:
        """What members are spawned with (env and resources only shape the fingerprint and
        the limits; the request's own env reaches the workload in the activation). Made once:
        a profile that changes in any of these is a new pool."""
        return SandboxSpec(
            image=self.profile.image,
            environment=dict(self.profile.environment),
            resources=self.profile.resources,
            runtime_class_name=self.profile.runtime_class_name,
            storage=self.profile.storage,
        )

    def claim(self) -> Instance | None:
        """Take the oldest registered idle member out of the pool (it never comes back)."""
        for index, member in enumerate(self.members):
            if member.registered and member.alive:
                self.ready.discard(member.instance_id)
                return self.members.pop(index)
        return None

    def view(self, extra: tuple[DriverCondition, ...] = ()) -> PoolView:
        """How `warmshell pool list` shows it."""
        profile = self.profile
        # (A registered member whose process just ended counts until its end is handled.)
        claimable = len(self.ready)
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
            network_allow=profile.network_allow,
            network_deny=profile.network_deny,
            secret_hosts=profile.secret_hosts,
        )


def _building(error: InvalidArgumentError) -> bool:
    return isinstance(error, ProfileError) and error.reason in (preparing.BUILDING, preparing.BUILD_FAILED)


def _invalid(error: InvalidArgumentError) -> DriverCondition:
    reason = error.reason if isinstance(error, ProfileError) else "InvalidProfile"
    return DriverCondition("ProfileValid", "False", reason, str(error))


class PoolSet:
    """Every pool of the driver, the fingerprint index over them, and the refill loop."""

    def __init__(
        self,
        *,
        members: Members,
        default_image: str,
        validate: Callable[[Profile], Profile],
        probe_seconds: float = 1.0,
        check_seconds: float = 10.0,
        max_concurrent_spawns: int = 8,
    ) -> None:
        """`members` starts and stops the pools' members; `validate` refuses a profile this
        driver cannot serve (InvalidArgumentError), else gives it as the driver serves it (its
        image pinned to a digest)."""
        self._members = members
        self._default_image = default_image
        self._validate = validate
        self._slots = asyncio.Semaphore(max_concurrent_spawns)
        self._pools: dict[str, Pool] = {}
        self._errors: dict[str, InvalidArgumentError] = {}
        self._given: tuple[Mapping[str, Profile], Mapping[str, ProfileError]] = ({}, {})
        self._shared: dict[str, tuple[str, ...]] = {}  # pool -> the other pools of its shape
        self._index: PoolIndex[Pool] = PoolIndex(None)
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._checker: asyncio.Task[None] | None = None
        self._probe_seconds = probe_seconds
        self._check_seconds = check_seconds
        self._claiming = 0  # claims in flight
        self._overlapped = False  # whether claims of this run of creates were in flight together
        self._last_claim = float("-inf")  # when a claim last took a member (loop time)

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
        self._given = (profiles, errors)
        self._errors = dict(errors)
        for name, profile in profiles.items():
            try:
                profile = self._validate(profile)
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
            if not _building(error):  # (a build's progress is logged by the builder)
                _log.warning("warm pool %s: invalid profile: %s", name, error)
        for name, others in sorted(self._shared.items()):
            message = poolshapes.shared_shape_message(others, self._pools[name].fingerprint)
            _log.warning("warm pool %s: %s", name, message)
        self.wake()

    def reapply(self) -> None:
        """Apply the profiles last read again (what `validate` makes of them changed: a pool's
        image was built, or its build may be retried)."""
        self.apply(*self._given)

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
        pool.ready.clear()
        for member in members:
            self._background(self._members.stop(member))

    # -- member lifecycle ------------------------------------------------------------------

    def member_registered(self, member: Instance) -> None:
        """A member's supervisor registered: it can be claimed; the pool is healthy again."""
        pool = self._pools.get(member.pool_name)
        if pool is not None and member in pool.members:
            pool.ready.add(member.instance_id)
            pool.failures = 0
            pool.conditions = ()

    def member_ended(self, member: Instance, message: str) -> None:
        """An idle member's process ended on its own: forget it, refill (with backoff if it
        never registered)."""
        pool = self._pools.get(member.pool_name)
        if pool is None or member not in pool.members:
            return
        pool.members.remove(member)
        pool.ready.discard(member.instance_id)
        if not member.registered:
            self._failed(pool, message)
        self.wake()

    def _failed(self, pool: Pool, message: str) -> None:
        pool.failures += 1
        delay = doubling_delay(pool.failures, first=_BACKOFF_FIRST, cap=_BACKOFF_MAX)
        pool.retry_at = asyncio.get_running_loop().time() + delay
        pool.conditions = (DriverCondition("MembersHealthy", "False", "MemberFailed", message),)
        _log.warning(
            "warm pool %s: member failed (%d in a row), retrying in %.1fs: %s",
            pool.name,
            pool.failures,
            delay,
            message,
        )

    # -- claims and liveness ---------------------------------------------------------------

    def claim(self, pool: Pool) -> Claim:
        """One create's claim on `pool`: `async with pools.claim(pool) as claim`, then the
        caller's loop (see `Claim`)."""
        return Claim(self, pool)

    def _claim_started(self) -> None:
        self._claiming += 1
        self._overlapped = self._overlapped or self._claiming > 1

    def _claimed(self) -> None:
        """A member left the pool for a claim (it never returns): refills may start."""
        self._last_claim = asyncio.get_running_loop().time()
        self.wake()

    def _claim_ended(self) -> None:
        self._claiming -= 1
        self.wake()

    async def _answers(self, member: Instance) -> bool:
        return member.process is not None and await member.process.responsive(self._probe_seconds)

    def _spend(self, member: Instance) -> None:
        self._background(self._members.stop(member))

    async def _check(self, pool: Pool, *, yield_to_claims: bool = False) -> None:
        """Ping every registered idle member of the pool, `_CHECK_SLICE` at a time; spend those
        that do not answer. With `yield_to_claims` (the periodic check), a slice waits while
        creates are being served."""
        idle = [m for m in pool.members if m.registered and m.alive]
        for start in range(0, len(idle), _CHECK_SLICE):
            while yield_to_claims and self._busy():  # noqa: ASYNC110 - busy is a time window, not an event
                await asyncio.sleep(_BUSY_SECONDS)
            await self._check_slice(pool, idle[start : start + _CHECK_SLICE])

    async def _check_slice(self, pool: Pool, idle: list[Instance]) -> None:
        answers = await asyncio.gather(*(self._answers(m) for m in idle))
        for member, answered in zip(idle, answers, strict=True):
            if not answered and member in pool.members:
                _log.warning(
                    "warm pool %s: idle member %s did not answer its liveness check within %gs; replacing it",
                    pool.name,
                    member.instance_id,
                    self._probe_seconds,
                )
                pool.members.remove(member)
                pool.ready.discard(member.instance_id)
                self._spend(member)
                self.wake()

    async def _check_every(self) -> None:
        while True:
            await asyncio.sleep(self._check_seconds)
            if not self._busy():  # a round of pings waits for a pause in the creates
                for pool in list(self._pools.values()):
                    await self._check(pool, yield_to_claims=True)

    def _busy(self) -> bool:
        """Whether creates are being served: a claim in flight, or one in the last moments."""
        return self._claiming > 0 or asyncio.get_running_loop().time() < self._last_claim + _BUSY_SECONDS

    # -- the refill loop -------------------------------------------------------------------

    def wake(self) -> None:
        """Ask the refill loop to look at every pool again."""
        self._wake.set()

    def start(self) -> None:
        """Run the refill loop and the idle members' liveness checks."""
        self._runner = asyncio.create_task(self._run(), name="local-pools")
        self._checker = asyncio.create_task(self._check_every(), name="local-pool-liveness")

    async def aclose(self) -> None:
        """Stop refilling and checking, and stop every idle member."""
        for task in (self._runner, self._checker):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
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
        """The refill rule. Members start as soon as they are missing, but while creates are
        being served (a claim in flight, or one in the last `_BUSY_SECONDS`) few start at a
        time: one if claims of this run of creates were in flight together (a burst keeps the
        machine nearly to itself; its last claims, one at a time, are still the burst's), else
        `_SPAWNS_WHILE_BUSY` (a client creating back to back does not drain its pool); every
        missing member the moment creates pause. On top of that members start at a lower CPU
        priority (`local.refill_nice`), and a pool whose members failed waits out its backoff.
        Surplus members (fewer replicas now) are stopped, the youngest first."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        busy_until = self._last_claim + _BUSY_SECONDS
        busy = self._busy()
        self._overlapped = self._overlapped and busy
        allowed = 1 if self._overlapped else _SPAWNS_WHILE_BUSY
        budget = max(0, allowed - sum(p.spawning for p in self._pools.values())) if busy else None
        wake_at: float | None = busy_until if busy else None
        for pool in self._pools.values():
            if pool.retry_at > now:
                wake_at = pool.retry_at if wake_at is None else min(wake_at, pool.retry_at)
                continue
            missing = pool.profile.replicas - len(pool.members) - pool.spawning
            count = missing if budget is None else min(missing, budget)
            for _ in range(count):
                pool.spawning += 1
                self._background(self._spawn(pool))
            if budget is not None:
                budget -= max(0, count)
            if missing < 0:  # the youngest are the least likely registered
                extra, pool.members = pool.members[missing:], pool.members[:missing]
                for member in extra:
                    pool.ready.discard(member.instance_id)
                    self._background(self._members.stop(member))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake_at is not None:
            self._timer = loop.call_at(wake_at, self._wake.set)

    async def _spawn(self, pool: Pool) -> None:
        try:
            async with self._slots:
                if pool.retired:
                    return
                member = await self._members.spawn(pool)
        except (WarmshellError, OSError) as exc:
            self._failed(pool, str(exc))
        else:
            if pool.retired:
                await self._members.stop(member)
            else:
                pool.members.append(member)
                if member.registered:  # (it registered while its spawn was being awaited)
                    pool.ready.add(member.instance_id)
        finally:
            pool.spawning -= 1
            self.wake()

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class Claim:
    """One create's claim on a pool, driven by the caller's loop: `next_live` hands out the
    pool's registered idle members one at a time, the caller activates each and says whether it
    was `taken` or `spent` (never back in a pool). A member handed out and neither is spent when
    the claim ends. After `_PROBES_PER_CLAIM` failed probes `next_live` gives up, so the create
    goes cold and the rest of the pool is checked in the background: a pool of hung members
    costs one create seconds, not minutes."""

    def __init__(self, pools: PoolSet, pool: Pool) -> None:
        self._pools = pools
        self._pool = pool
        self._failed_probes = 0
        self._open: Instance | None = None  # handed out, neither taken nor spent yet

    async def __aenter__(self) -> Claim:
        self._pools._claim_started()
        return self

    async def __aexit__(self, *exc_info: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._open is not None:
            self.spent(self._open)
        self._pools._claim_ended()

    async def next_live(self) -> Instance | None:
        """The pool's oldest registered idle member that answers its liveness probe; None when
        there is none (or too many did not answer)."""
        pools, pool = self._pools, self._pool
        while self._failed_probes < _PROBES_PER_CLAIM and (member := pool.claim()) is not None:
            pools._claimed()
            if await pools._answers(member):
                self._open = member
                return member
            _log.warning(
                "warm pool %s: member %s did not answer its liveness probe within %gs; replacing it",
                pool.name,
                member.instance_id,
                pools._probe_seconds,
            )
            self._failed_probes += 1
            pools._spend(member)
            pools._background(pools._check(pool))
        return None

    def taken(self, member: Instance) -> None:
        """The member serves the create now: a hit."""
        self._open = None
        self._pool.hits += 1

    def spent(self, member: Instance) -> None:
        """The member could not be activated: stop it (the next one may be tried)."""
        self._open = None
        self._pools._spend(member)


def _invalid_view(name: str, error: InvalidArgumentError) -> PoolView:
    if isinstance(error, ProfileError):
        return invalid_profile_view(name, source=error.source, message=str(error), reason=error.reason)
    return invalid_profile_view(name, source="", message=str(error))
