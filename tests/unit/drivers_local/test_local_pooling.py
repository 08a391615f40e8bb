"""Pool bookkeeping with fake members (no processes): refill, claims, liveness, profile changes,
failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from warmshell.core.errors import InvalidArgumentError, UnavailableError
from warmshell.core.ids import InstanceId
from warmshell.core.matching import Match, NoMatch, NotReady
from warmshell.core.profiles import Profile, ProfileError
from warmshell.drivers.base import BackendState
from warmshell.drivers.local.instances import Instance
from warmshell.drivers.local.pools import pooling
from warmshell.drivers.local.pools.pooling import Pool, PoolSet


class Agent:
    """A fake sandbox process: answers the liveness probe while `answers` is set."""

    def __init__(self) -> None:
        self.answers = True
        self.probes = 0

    async def responsive(self, timeout: float) -> bool:
        self.probes += 1
        return self.answers


class Members:
    """A fake fleet: spawning makes a running Instance with a fake agent, stopping records it."""

    def __init__(self) -> None:
        self.spawned: list[Instance] = []
        self.stopped: list[Instance] = []
        self.fail_with: Exception | None = None
        self.gate: asyncio.Event | None = None  # when set, spawns wait for it

    async def spawn(self, pool: Pool) -> Instance:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        member = Instance(
            instance_id=InstanceId(f"li-{len(self.spawned)}"),
            workspace=pool.profile.workspace,
            hostname="h",
            directory=Path("/nowhere"),
            created_us=1,
            pool=pool.fingerprint,
            pool_name=pool.name,
            state=BackendState.RUNNING,
            process=Agent(),  # type: ignore[arg-type]
        )
        self.spawned.append(member)
        return member

    async def stop(self, member: Instance) -> None:
        member.deleting = True
        self.stopped.append(member)


def profile(name: str = "p", replicas: int = 2, **fields: object) -> Profile:
    return Profile(name=name, source=f"/pools/{name}.toml", workspace="default", replicas=replicas, **fields)  # type: ignore[arg-type]


def refuse_images(profile: Profile) -> Profile:
    if profile.image:
        raise InvalidArgumentError("spec.image", "no images here")
    return profile


@pytest.fixture
def members() -> Members:
    return Members()


@pytest.fixture
async def pools(members: Members) -> AsyncIterator[PoolSet]:
    pool_set = PoolSet(members=members, default_image="", validate=refuse_images, check_seconds=0.05)
    pool_set.start()
    yield pool_set
    if members.gate is not None:  # a test that failed with spawns held must not hang its teardown
        members.gate.set()
    await pool_set.aclose()


async def settle(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


def internal(pools: PoolSet, name: str) -> Pool:
    return pools._pools[name]


async def claim(pools: PoolSet, pool: Pool, take: Callable[[Instance], Awaitable[bool]]) -> Instance | None:
    """What the driver does with a claim: offer each live member to `take` (its activation)
    until one is taken."""
    async with pools.claim(pool) as claiming:
        while (member := await claiming.next_live()) is not None:
            if await take(member):
                claiming.taken(member)
                return member
            claiming.spent(member)
    return None


def agent(member: Instance) -> Agent:
    assert isinstance(member.process, Agent)
    return member.process


async def registered(pools: PoolSet, members: Members, name: str, count: int) -> Pool:
    """Wait for `count` members of the pool and register them all."""
    pool = internal(pools, name)
    await settle(lambda: len(pool.members) == count)
    for member in pool.members:
        member.registered = True
        pools.member_registered(member)
    return pool


async def refills_held(pools: PoolSet, members: Members, monkeypatch: pytest.MonkeyPatch, *, replicas: int) -> Pool:
    """A full pool of registered members whose refills, once started, wait for `members.gate`;
    claims up to 1 s apart are one run of creates (a stall of the test machine must not end it)."""
    monkeypatch.setattr(pooling, "_BUSY_SECONDS", 1.0)
    pools.apply({"p": profile(replicas=replicas)}, {})
    pool = await registered(pools, members, "p", replicas)
    members.gate = asyncio.Event()
    return pool


async def test_during_a_burst_of_creates_one_member_at_a_time_is_started(
    pools: PoolSet, members: Members, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await refills_held(pools, members, monkeypatch, replicas=4)
    release = asyncio.Event()

    async def take(member: Instance) -> bool:
        await release.wait()
        return True

    claims = [asyncio.create_task(claim(pools, pool, take)) for _ in range(3)]
    await settle(lambda: len(pool.members) == 1)  # three claimed, the claims in flight
    for _ in range(50):  # every chance to start more
        await asyncio.sleep(0)
    assert pool.spawning == 1
    release.set()
    assert {await c for c in claims} == set(members.spawned[:3])
    assert pool.hits == 3
    one_more = await claim(pools, pool, take)  # a late create of the burst, alone in flight
    assert one_more is members.spawned[3]
    for _ in range(50):
        await asyncio.sleep(0)
    assert pool.spawning == 1  # still one: the run of creates had claims in flight together
    # Once claims pause, every missing member starts at once.
    await settle(lambda: pool.spawning == 4)
    members.gate.set()
    await settle(lambda: len(pool.members) == 4)


async def test_while_creates_come_one_at_a_time_two_members_at_a_time_are_started(
    pools: PoolSet, members: Members, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await refills_held(pools, members, monkeypatch, replicas=5)

    async def take(member: Instance) -> bool:
        return True

    for _ in range(4):  # back to back, as one client creating in a loop
        assert await claim(pools, pool, take) is not None
        for _ in range(20):
            await asyncio.sleep(0)
    # Still within the busy window of the last claim: two starts, not one and not all four.
    assert pool.spawning == 2
    await settle(lambda: pool.spawning == 4)  # the claims paused
    members.gate.set()
    await settle(lambda: len(pool.members) == 5)


async def test_a_member_not_taken_is_spent_and_the_next_one_tried(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(replicas=2)}, {})
    pool = await registered(pools, members, "p", 2)
    offered: list[Instance] = []

    async def take(member: Instance) -> bool:
        offered.append(member)
        return len(offered) == 2

    assert await claim(pools, pool, take) is members.spawned[1]
    assert offered == members.spawned[:2]
    await settle(lambda: members.stopped == [members.spawned[0]])
    assert pool.hits == 1


async def test_a_member_whose_activation_raises_is_spent_when_the_claim_ends(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(replicas=2)}, {})
    pool = await registered(pools, members, "p", 2)

    async def take(member: Instance) -> bool:
        raise asyncio.CancelledError  # the create was cancelled mid-activation

    with pytest.raises(asyncio.CancelledError):
        await claim(pools, pool, take)
    await settle(lambda: members.stopped == [members.spawned[0]])
    assert pool.hits == 0
    assert pools._claiming == 0  # the claim no longer holds refills back


async def test_members_that_fail_the_probe_are_spent_and_the_create_goes_cold_soon(
    pools: PoolSet, members: Members
) -> None:
    pools.apply({"p": profile(replicas=4)}, {})
    pool = await registered(pools, members, "p", 4)
    hung = list(pool.members)
    for member in hung:
        agent(member).answers = False
    taken: list[Instance] = []

    async def take(member: Instance) -> bool:
        taken.append(member)
        return True

    # Two failed probes and the create goes cold; the rest of the pool is checked at once.
    assert await claim(pools, pool, take) is None
    assert taken == []
    assert sum(agent(m).probes > 0 for m in hung) >= 2
    await settle(lambda: set(members.stopped) == set(hung))
    await settle(lambda: len(pool.members) == 4 and not set(pool.members) & set(hung))  # replaced


async def test_an_idle_member_that_stops_answering_is_replaced_without_a_claim(
    pools: PoolSet, members: Members
) -> None:
    pools.apply({"p": profile(replicas=2)}, {})
    pool = await registered(pools, members, "p", 2)
    stuck, fine = pool.members
    agent(stuck).answers = False
    await settle(lambda: members.stopped == [stuck])  # the periodic check (every 0.05 s here)
    await settle(lambda: len(pool.members) == 2)
    assert fine in pool.members
    assert stuck not in pool.members


async def test_not_ready_until_the_first_apply(pools: PoolSet, members: Members) -> None:
    fp = profile().fingerprint("")
    assert pools.lookup(fp) == NotReady()
    pools.apply({"p": profile()}, {})
    assert pools.lookup(fp) == Match(internal(pools, "p"))
    assert pools.lookup(profile(environment={"A": "b"}).fingerprint("")) == NoMatch()
    await settle(lambda: len(members.spawned) == 2)


async def test_claim_only_registered_members(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile()}, {})
    await settle(lambda: len(internal(pools, "p").members) == 2)
    pool = internal(pools, "p")
    assert pool.claim() is None
    assert (pool.view().ready, pool.view().idle) == (0, 0)
    second = pool.members[1]
    second.registered = True
    pools.member_registered(second)
    assert (pool.view().ready, pool.view().idle, pool.view().desired) == (1, 1, 2)
    assert pool.claim() is second
    assert second not in pool.members
    pools.wake()
    await settle(lambda: len(members.spawned) == 3)


async def test_replicas_change_keeps_members_and_scales_down(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(replicas=3)}, {})
    await settle(lambda: len(internal(pools, "p").members) == 3)
    first = list(internal(pools, "p").members)
    pools.apply({"p": profile(replicas=1)}, {})
    await settle(lambda: len(members.stopped) == 2)
    assert internal(pools, "p").members == first[:1]
    assert members.stopped == first[1:]


async def test_changed_profile_replaces_idle_members(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile()}, {})
    await settle(lambda: len(internal(pools, "p").members) == 2)
    old = internal(pools, "p")
    old.hits = 3
    pools.apply({"p": profile(environment={"FOO": "bar"})}, {})
    new = internal(pools, "p")
    assert new is not old
    assert new.fingerprint != old.fingerprint
    assert new.hits == 3
    await settle(lambda: len(members.stopped) == 2 and len(new.members) == 2)
    assert set(members.stopped) == set(members.spawned[:2])


async def test_removed_profile_drains(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(), "q": profile("q", 1, environment={"Q": "1"})}, {})
    await settle(lambda: len(members.spawned) == 3)
    pools.apply({"q": profile("q", 1, environment={"Q": "1"})}, {})
    await settle(lambda: len(members.stopped) == 2)
    assert [v.name for v in pools.views()] == ["q"]
    assert pools.lookup(profile().fingerprint("")) == NoMatch()


async def test_invalid_profiles_are_reported_not_applied(pools: PoolSet, members: Members) -> None:
    error = ProfileError("/pools/bad.toml", "replicas", "must be between 1 and 64", 3)
    pools.apply({"p": profile(), "img": profile("img", image="/nope")}, {"bad": error})
    views = {v.name: v for v in pools.views()}
    assert set(views) == {"p", "bad", "img"}
    (condition,) = views["bad"].conditions
    assert (condition.type, condition.status, condition.reason) == (
        "ProfileValid",
        "False",
        "InvalidProfile",
    )
    assert "/pools/bad.toml:3: replicas" in condition.message
    assert views["bad"].desired == 0
    assert "no images here" in views["img"].conditions[0].message
    # A valid pool that becomes invalid keeps serving, flagged.
    await settle(lambda: len(internal(pools, "p").members) == 2)
    pools.apply({}, {"p": ProfileError("/pools/p.toml", "(syntax)", "not valid TOML")})
    assert internal(pools, "p").members
    (flag,) = {v.name: v for v in pools.views()}["p"].conditions
    assert flag.type == "ProfileValid"
    assert members.stopped == []


async def test_spawn_failures_back_off_and_registration_heals(pools: PoolSet, members: Members) -> None:
    members.fail_with = UnavailableError("cannot start a local supervisor: no such file")
    pools.apply({"p": profile(replicas=1)}, {})
    pool = internal(pools, "p")
    await settle(lambda: pool.failures >= 1)
    assert pool.retry_at > asyncio.get_running_loop().time()
    (condition,) = pool.conditions
    assert (condition.type, condition.reason) == ("MembersHealthy", "MemberFailed")
    assert "no such file" in condition.message
    failures = pool.failures
    for _ in range(50):
        await asyncio.sleep(0)
    assert pool.failures == failures, "no retry before the backoff expires"

    members.fail_with = None
    pool.retry_at = 0
    pools.wake()
    await settle(lambda: len(pool.members) == 1)
    member = pool.members[0]
    member.registered = True
    pools.member_registered(member)
    assert (pool.failures, pool.conditions) == (0, ())


async def test_member_that_never_registered_counts_as_a_failure(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(replicas=1)}, {})
    pool = internal(pools, "p")
    await settle(lambda: len(pool.members) == 1)
    pools.member_ended(pool.members[0], "exited with status 1 before registering")
    assert pool.failures == 1
    assert pool.members == []


async def test_a_liveness_check_of_a_large_pool_pings_a_slice_at_a_time(members: Members) -> None:
    # All 1,000 idle members of a pool pinged at once held the event loop for tens of
    # milliseconds, and every create that arrived meanwhile waited (the scale run's p99).
    pools = PoolSet(members=members, default_image="", validate=refuse_images, check_seconds=3600)
    pools.start()  # the periodic check does not run during the test: only the one called here
    try:
        await _check_a_large_pool(pools, members)
    finally:
        await pools.aclose()


async def _check_a_large_pool(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(replicas=100)}, {})
    pool = await registered(pools, members, "p", 100)
    in_flight, most = 0, 0

    class SlowAgent(Agent):
        async def responsive(self, timeout: float) -> bool:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.001)
            in_flight -= 1
            return await super().responsive(timeout)

    slow = [SlowAgent() for _ in pool.members]
    for member, fake in zip(pool.members, slow, strict=True):
        member.process = fake  # type: ignore[assignment]
    await pools._check(pool)
    assert all(fake.probes >= 1 for fake in slow), "every idle member is checked"
    assert 1 < most <= 16
    assert len(pool.members) == 100
    assert not members.stopped


class Untouchable(list[Instance]):
    """A pool's members that fail the test if walked."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("view() walked the members")


def walked(pool: Pool) -> int:
    return sum(1 for m in list.__iter__(pool.members) if m.registered and m.alive)


async def test_a_view_counts_ready_members_without_walking_them(pools: PoolSet, members: Members) -> None:
    pools.apply({"p": profile(replicas=6)}, {})
    pool = await registered(pools, members, "p", 6)
    assert pool.view().ready == walked(pool) == 6
    pool.members = Untouchable(pool.members)
    assert (pool.view().ready, pool.view().idle) == (6, 6)
    pool.members = list(list.__iter__(pool.members))
    # Every way a member leaves: claimed, ended on its own, spent by the liveness check, scaled down.
    claimed = pool.claim()
    assert claimed is not None
    assert pool.view().ready == walked(pool) == 5
    ended = pool.members[0]
    ended.state = BackendState.EXITED
    pools.member_ended(ended, "exited")
    assert pool.view().ready == walked(pool) == 4
    agent(pool.members[0]).answers = False
    await settle(lambda: pool.view().ready == 3)
    assert walked(pool) == 3
    pools.apply({"p": profile(replicas=1)}, {})
    await settle(lambda: len(pool.members) == 1)
    assert pool.view().ready == walked(pool) <= 1
    # A second registration of the same member counts it once; a retired pool counts none.
    for member in list(pool.members):
        member.registered = True
        pools.member_registered(member)
        pools.member_registered(member)
    assert pool.view().ready == walked(pool) == 1
    pools.apply({"p": profile(replicas=1, environment={"NEW": "1"})}, {})
    assert pool.view().ready == 0


async def test_a_member_that_registered_during_its_spawn_counts_as_ready(pools: PoolSet, members: Members) -> None:
    spawn = members.spawn

    async def registering_first(pool: Pool) -> Instance:
        member = await spawn(pool)
        member.registered = True
        pools.member_registered(member)  # before the pool has it: not counted here...
        return member

    members.spawn = registering_first  # type: ignore[method-assign]
    pools.apply({"p": profile(replicas=2)}, {})
    pool = internal(pools, "p")
    await settle(lambda: len(pool.members) == 2)
    assert pool.view().ready == walked(pool) == 2  # ...but once it joins
