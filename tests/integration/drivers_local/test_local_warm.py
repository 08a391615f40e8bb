"""Local warm pools with real bwrap'd sandboxes, stand-in host-side supervisors and an in-process
Activator."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from tests.integration.drivers_local.fakes import FakeActivator, registering
from tests.integration.drivers_local.support import DriverFactory, alive, credential_of, needs_bwrap
from tests.integration.drivers_local.waiting import wait_until
from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import NotFoundError, UnavailableError
from warmshell.core.ids import InstanceId, new_sandbox_id
from warmshell.core.models import Allocation, SandboxSpec
from warmshell.drivers.base import BackendState, Bound, CreateRequest, PoolView
from warmshell.drivers.local import LocalDriver, records
from warmshell.drivers.local.instances import LOG_SUFFIX

DEFAULT = 'version = 1\nworkspace = "default"\nreplicas = {replicas}\n'
ENV_FOO = DEFAULT + '[environment]\nFOO = "{value}"\n'

pytestmark = needs_bwrap


@pytest.fixture
def pools_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "pools"
    directory.mkdir()
    return directory


@pytest.fixture
def config(pools_dir: Path) -> LocalDriverConfig:
    return LocalDriverConfig(pools_dir=pools_dir, pool_reload_interval_seconds=0.02)


class EveryInstance(dict[InstanceId, Exception]):
    """FakeActivator.failures failing every instance with one error."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: InstanceId) -> Exception:
        return self.error


def request(env: dict[str, str] | None = None, proof: str = "proof-1") -> CreateRequest:
    return CreateRequest(
        sandbox_id=new_sandbox_id(),
        name="demo",
        workspace="default",
        spec=SandboxSpec(environment=env or {}),
        activation_proof=proof,
    )


def pool(driver: LocalDriver, name: str) -> PoolView:
    (found,) = [p for p in driver.pools() if p.name == name]
    return found


def has_pool(driver: LocalDriver, name: str, **expected: int) -> bool:
    views = [p for p in driver.pools() if p.name == name]
    return bool(views) and all(getattr(views[0], k) == v for k, v in expected.items())


async def hostname_of(driver: LocalDriver, instance_id: str) -> str:
    """The hostname inside a sandbox, read through its UTS namespace."""
    process = driver._fleet.instances[InstanceId(instance_id)].process
    assert process is not None
    pid = await process.sandbox_pid()
    assert pid is not None
    nsenter = await asyncio.create_subprocess_exec(
        "nsenter", "-t", str(pid), "-u", "hostname", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await nsenter.communicate()
    return out.decode().strip()


def member_pids(driver: LocalDriver, name: str) -> list[int]:
    return [
        m.process.pid
        for m in driver._fleet.instances.values()
        if m.pool_name == name and m.sandbox_id is None and m.process is not None
    ]


async def test_matching_create_gets_a_registered_member_and_the_pool_refills(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=2))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", ready=2, idle=2))
            idle_before = {m.instance_id for m in driver._fleet.instances.values()}
            events = driver.watch()
            req = request()
            served = await driver.create(req)

            assert served.allocation is Allocation.WARM
            assert served.pool == "default"
            assert served.miss_reason == ""
            assert served.instance_id in idle_before
            (call,) = activator.calls
            assert (call.instance_id, call.sandbox_id, call.proof, call.reason) == (
                served.instance_id,
                req.sandbox_id,
                "proof-1",
                "pool/default",
            )
            # Re-registration of the claimed instance now says it is bound to the sandbox.
            credential = credential_of(paths, served.instance_id).read_text()
            identity = await driver.identity.authenticate(credential)
            assert identity is not None
            assert identity.binding == Bound(req.sandbox_id, "proof-1")
            assert await driver.create(req) == await driver.get(req.sandbox_id)
            assert await hostname_of(driver, served.instance_id) == "demo"  # was its instance id

            # Refilled with a fresh member; the used one never returns.
            await wait_until(lambda: has_pool(driver, "default", ready=2, idle=2, hits=1))
            members = {m.instance_id for m in driver._fleet.instances.values() if m.sandbox_id is None}
            assert served.instance_id not in members
            first = await asyncio.wait_for(events.__anext__(), 5)
            assert first.progress is not None
            assert first.progress.reason == "PoolHit"


async def test_misses_go_cold_with_a_reason(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "a.toml").write_text(ENV_FOO.format(replicas=1, value="bar"))
    (pools_dir / "b.toml").write_text(ENV_FOO.format(replicas=1, value="bar"))  # same shape
    (pools_dir / "empty.toml").write_text(ENV_FOO.format(replicas=1, value="empty"))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        # Before start() the pools are unknown.
        early = await driver.create(request())
        assert (early.allocation, early.miss_reason) == (Allocation.COLD, "NotReady")

        await driver.start(activator)
        await wait_until(lambda: len(driver.pools()) == 3)
        no_match = await driver.create(request({"FOO": "other"}))
        assert (no_match.allocation, no_match.miss_reason) == (Allocation.COLD, "NoMatch")
        ambiguous = await driver.create(request({"FOO": "bar"}))
        assert ambiguous.miss_reason == "Ambiguous"
        assert pool(driver, "a").misses == pool(driver, "b").misses == 1
        # Nobody registers in this test, so the matching pool has no claimable member.
        empty = await driver.create(request({"FOO": "empty"}))
        assert (empty.allocation, empty.miss_reason) == (Allocation.COLD, "Empty")
        assert pool(driver, "empty").misses == 1
        assert activator.calls == []


async def test_no_pools_dir_is_disabled(make_driver: DriverFactory) -> None:
    async with make_driver() as driver:
        await driver.start(FakeActivator())
        created = await driver.create(request())
        assert created.miss_reason == "Disabled"
        assert driver.pools() == []


@pytest.mark.parametrize("error", [NotFoundError("gone"), UnavailableError("stream closed")])
async def test_failed_activation_spends_the_member_and_tries_the_next(
    make_driver: DriverFactory,
    config: LocalDriverConfig,
    pools_dir: Path,
    paths: StatePaths,
    error: Exception,
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=2))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", idle=2))
            first, second = driver._pools._pools["default"].members  # type: ignore[union-attr]
            assert first.process is not None
            activator.failures[first.instance_id] = error
            served = await driver.create(request())
            assert served.allocation is Allocation.WARM
            assert [c.instance_id for c in activator.calls] == [
                first.instance_id,
                second.instance_id,
            ]
            assert served.instance_id == second.instance_id
            await wait_until(lambda: not alive(first.process.pid))  # type: ignore[union-attr]
            await wait_until(lambda: has_pool(driver, "default", ready=2, idle=2))


async def test_all_members_failing_activation_goes_cold_empty(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=1))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", idle=1))
            # Every member fails, the replacement too: refills start during the claim now, and a
            # slow claim could otherwise be served warm by one that registered meanwhile.
            activator.failures = EveryInstance(NotFoundError("gone"))
            served = await driver.create(request())
            assert (served.allocation, served.miss_reason) == (Allocation.COLD, "Empty")
            assert activator.calls, "a member was tried"


async def test_profile_changes_replace_and_drain_members(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    profile = pools_dir / "env.toml"
    profile.write_text(ENV_FOO.format(replicas=2, value="one"))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "env", idle=2))
            old_fp = pool(driver, "env").fingerprint
            old_pids = member_pids(driver, "env")

            # Only replicas changed: the members stay, one is added.
            profile.write_text(ENV_FOO.format(replicas=3, value="one"))
            await wait_until(lambda: has_pool(driver, "env", idle=3, desired=3))
            assert set(old_pids) <= set(member_pids(driver, "env"))
            assert pool(driver, "env").fingerprint == old_fp

            # The shape changed: a new fingerprint, every old member stopped.
            pids = member_pids(driver, "env")
            profile.write_text(ENV_FOO.format(replicas=1, value="two"))
            await wait_until(lambda: pool(driver, "env").fingerprint != old_fp)
            await wait_until(lambda: has_pool(driver, "env", ready=1, idle=1))
            await wait_until(lambda: not any(alive(pid) for pid in pids))
            warm = await driver.create(request({"FOO": "two"}))
            assert warm.allocation is Allocation.WARM
            cold = await driver.create(request({"FOO": "one"}))
            assert cold.miss_reason == "NoMatch"

            # Removed: drained.
            pids = member_pids(driver, "env")
            profile.unlink()
            await wait_until(lambda: driver.pools() == [])
            await wait_until(lambda: not any(alive(pid) for pid in pids))


async def test_invalid_profile_is_reported_and_does_not_break_others(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=1))
    bad = pools_dir / "bad.toml"
    bad.write_text(DEFAULT.format(replicas=1) + "colour = 'red'\n")
    image = pools_dir / "image.toml"
    image.write_text(DEFAULT.format(replicas=1) + "image = 'ubuntu:24.04'\n")
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", idle=1))
            (condition,) = pool(driver, "bad").conditions
            assert (condition.type, condition.status) == ("ProfileValid", "False")
            assert f"{bad}:4: colour" in condition.message
            (condition,) = pool(driver, "image").conditions
            assert "image" in condition.message
            assert "ubuntu:24.04" in condition.message
            assert (pool(driver, "bad").desired, pool(driver, "bad").idle) == (0, 0)

            # Fixed: it comes up. Broken again: the last good version keeps serving.
            bad.write_text(ENV_FOO.format(replicas=1, value="fixed"))
            await wait_until(lambda: has_pool(driver, "bad", idle=1))
            assert pool(driver, "bad").conditions == ()
            bad.write_text("version = 1\nreplicas = [\n")
            await wait_until(lambda: pool(driver, "bad").conditions != ())
            assert has_pool(driver, "bad", desired=1, idle=1)
            served = await driver.create(request({"FOO": "fixed"}))
            assert served.allocation is Allocation.WARM


async def test_members_that_die_before_registering_back_off(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=1))
    crash = "echo 'supervisor: broken install' >&2; exit 1"
    async with make_driver(script=crash, config=config) as driver:
        await driver.start(FakeActivator())
        await wait_until(lambda: has_pool(driver, "default") and pool(driver, "default").conditions != ())
        (condition,) = pool(driver, "default").conditions
        assert (condition.type, condition.reason) == ("MembersHealthy", "MemberFailed")
        assert "broken install" in condition.message
        internal = driver._pools._pools["default"]  # type: ignore[union-attr]
        await wait_until(lambda: internal.failures >= 2)
        # Exponential: the next retry is at least 1 s after the second failure.
        loop_now = asyncio.get_running_loop().time()
        assert internal.retry_at - loop_now > 0.5


def recorded(paths: StatePaths) -> set[str]:
    return {p.stem for p in paths.instances.glob("*.json")} if paths.instances.exists() else set()


async def test_an_idle_member_has_no_record_until_claimed_and_a_drained_pool_leaves_no_files(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=3))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", ready=3, idle=3))
            members = {m.instance_id for m in driver._fleet.instances.values()}
            assert recorded(paths) == set()  # nothing a crash would need: the sweep finds their logs
            logs = {m.log_path for m in driver._fleet.instances.values()}
            assert all(log.exists() and log.name.removesuffix(LOG_SUFFIX) in members for log in logs)
            served = await driver.create(request())
            served_log = driver._fleet.instances[InstanceId(served.instance_id)].log_path
            await wait_until(lambda: recorded(paths) == {served.instance_id})  # written in the background
            (record,) = records.load_all(paths.instances)
            assert record.sandbox_id == served.sandbox_id
            await driver.delete(served.sandbox_id)
            assert recorded(paths) == set()
            assert not (paths.sandboxes / served.instance_id).exists()
            assert not served_log.exists()
            (pools_dir / "default.toml").unlink()  # drained: every member stops at once
            await wait_until(lambda: not driver._fleet.instances)
            await wait_until(lambda: list(paths.sandboxes.iterdir()) == [])
            await wait_until(lambda: not any(log.exists() for log in logs))
            assert recorded(paths) == set()


async def test_idle_member_records_are_dropped_after_restart(make_driver: DriverFactory, paths: StatePaths) -> None:
    # What a crashed gateway leaves: the record of an idle member and of a claimed one.
    common = {"credential_digest": "0" * 64, "workspace": "default", "hostname": "h", "created_us": 1}
    records.save(paths.instances, records.InstanceRecord(instance_id="li-idle", pool="f" * 64, **common))
    records.save(
        paths.instances,
        records.InstanceRecord(instance_id="li-used", sandbox_id="sbx-1", pool="f" * 64, **common),
    )
    (paths.sandboxes / "li-idle").mkdir(parents=True)
    async with make_driver() as driver:
        assert [(s.sandbox_id, s.state) for s in await driver.list()] == [("sbx-1", BackendState.FAILED)]
        assert list(paths.instances.iterdir()) == []
        assert not (paths.sandboxes / "li-idle").exists()


async def test_refill_delay_seconds_is_still_accepted_with_a_deprecation_warning(
    make_driver: DriverFactory, config: LocalDriverConfig, caplog: pytest.LogCaptureFixture
) -> None:
    old = LocalDriverConfig.model_validate({**config.model_dump(), "refill_delay_seconds": 0.25})
    with caplog.at_level(logging.WARNING, logger="warmshell.drivers.local.driver"):
        async with make_driver(config=old):
            pass
    assert "local.refill_delay_seconds is deprecated and ignored" in caplog.text


async def test_a_burst_gets_distinct_members(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=6))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", idle=6))
            served = await asyncio.gather(*(driver.create(request()) for _ in range(8)))
            warm = [s for s in served if s.allocation is Allocation.WARM]
            assert len(warm) == 6
            assert len({s.instance_id for s in warm}) == 6
            assert sorted(s.miss_reason for s in served if s not in warm) == ["Empty", "Empty"]
            assert (pool(driver, "default").hits, pool(driver, "default").misses) == (6, 2)


async def test_a_registered_member_that_dies_is_replaced_without_backoff(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=1))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", idle=1))
            (member,) = driver._pools._pools["default"].members  # type: ignore[union-attr]
            assert member.process is not None
            sandbox_pid = await member.process.sandbox_pid()
            assert sandbox_pid is not None
            os.kill(sandbox_pid, signal.SIGKILL)  # the sandbox dies on its own
            await wait_until(
                lambda: has_pool(driver, "default", idle=1) and driver._pools._pools["default"].members[0] is not member  # type: ignore[union-attr]
            )
            assert pool(driver, "default").conditions == ()
            assert not (paths.sandboxes / member.instance_id).exists()


async def test_rename_falls_back_to_nsenter(
    make_driver: DriverFactory, config: LocalDriverConfig, pools_dir: Path, paths: StatePaths
) -> None:
    # As an unprivileged gateway would find it: joining the sandbox's namespace is refused.
    (pools_dir / "default.toml").write_text(DEFAULT.format(replicas=1))
    activator = FakeActivator()
    async with make_driver(config=config) as driver:

        def refuse(pid: int, name: str) -> None:
            raise PermissionError(1, "Operation not permitted")

        driver._hostnames._set_nowait = refuse  # type: ignore[method-assign]
        await driver.start(activator)
        async with registering(driver, paths.sandboxes, activator):
            await wait_until(lambda: has_pool(driver, "default", idle=1))
            served = await driver.create(request())
            assert served.allocation is Allocation.WARM
            assert await hostname_of(driver, served.instance_id) == "demo"
