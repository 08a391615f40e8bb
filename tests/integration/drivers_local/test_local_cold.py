"""The local driver's cold path with real bubblewrap sandboxes and a stand-in host-side supervisor."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.drivers_local.support import (
    DriverFactory,
    alive,
    credential_of,
    driver_pids,
    needs_bwrap,
    workspace_of,
)
from tests.integration.drivers_local.waiting import next_event, read_when_present, wait_until
from warmshell.core.config import LocalDriverConfig, StatePaths
from warmshell.core.errors import FailedPreconditionError, PermissionDeniedError
from warmshell.core.ids import SandboxId, new_sandbox_id
from warmshell.core.models import Allocation, Resources, SandboxSpec
from warmshell.drivers.base import BackendState, Bound, CreateRequest
from warmshell.drivers.local import LocalDriver
from warmshell.drivers.local.runtime import cgroups, launching
from warmshell.drivers.local.supervising import Seat

PROOF = "proof-" + "x" * 40

pytestmark = needs_bwrap


def request(sandbox_id: SandboxId | None = None, spec: SandboxSpec | None = None) -> CreateRequest:
    return CreateRequest(
        sandbox_id=sandbox_id or new_sandbox_id(),
        name="demo",
        workspace="default",
        spec=spec or SandboxSpec(),
        activation_proof=PROOF,
    )


async def test_cold_create_spawns_a_bound_supervisor(make_driver: DriverFactory, paths: StatePaths) -> None:
    async with make_driver() as driver:
        events = driver.watch()
        req = request()
        created = await driver.create(req)
        assert created.allocation is Allocation.COLD
        assert created.state in (BackendState.PENDING, BackendState.RUNNING)
        running = await next_event(events, lambda e: e.sandbox is not None and e.sandbox.state is BackendState.RUNNING)
        assert running.sandbox_id == req.sandbox_id

        workspace = workspace_of(paths, created.instance_id)
        credential = await read_when_present(credential_of(paths, created.instance_id))
        assert credential.startswith(f"wsl1.{created.instance_id}.")
        identity = await driver.identity.authenticate(credential)
        assert identity is not None
        assert identity.driver == "local"
        assert identity.instance_id == created.instance_id
        assert identity.workspace == "default"
        assert identity.binding == Bound(req.sandbox_id, PROOF)
        assert identity.binding.proof == PROOF  # Bound's repr hides it; compare the field

        # A command gets the environment its supervisor gave it, nothing of the host's or the agent's.
        env = dict(line.split("=", 1) for line in (await read_when_present(workspace / "env")).splitlines() if line)
        env.pop("PWD", None)
        env.pop("SHLVL", None)
        assert set(env) == {"PATH", "HOME", "WARMSHELL_INSTANCE_ID"}
        assert credential not in (workspace / "env").read_text()
        assert (await read_when_present(workspace / "hostname")).strip() == "demo"


async def test_record_keeps_the_proof_not_the_credential(make_driver: DriverFactory, paths: StatePaths) -> None:
    async with make_driver() as driver:
        created = await driver.create(request())
        credential = await read_when_present(credential_of(paths, created.instance_id))
        record_path = paths.instances / f"{created.instance_id}.json"
        await read_when_present(record_path)  # written in the background
        assert stat.S_IMODE(record_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(paths.instances.stat().st_mode) == 0o700
        text = record_path.read_text()
        assert credential not in text
        assert json.loads(text)["activation_proof"] == PROOF


async def test_create_is_idempotent(make_driver: DriverFactory) -> None:
    async with make_driver() as driver:
        req = request()
        first, second = await asyncio.gather(driver.create(req), driver.create(req))
        third = await driver.create(req)
        assert first.instance_id == second.instance_id == third.instance_id
        assert len(await driver.list()) == 1
        assert len(driver_pids(driver)) == 1


async def test_delete_kills_and_cleans_up(make_driver: DriverFactory, paths: StatePaths) -> None:
    async with make_driver() as driver:
        req = request()
        created = await driver.create(req)
        workspace = workspace_of(paths, created.instance_id)
        credential = await read_when_present(credential_of(paths, created.instance_id))
        (pid,) = driver_pids(driver)
        events = driver.watch()

        assert await driver.delete(req.sandbox_id) is True
        assert not alive(pid)
        assert not workspace.exists()
        assert not (paths.sandboxes / created.instance_id).exists()
        assert not (paths.instances / f"{created.instance_id}.json").exists()
        assert await driver.get(req.sandbox_id) is None
        gone = await next_event(events, lambda e: e.deleted)
        assert gone.sandbox_id == req.sandbox_id
        assert await driver.delete(req.sandbox_id) is False
        with pytest.raises(PermissionDeniedError):
            await driver.identity.authenticate(credential)


async def test_delete_kills_a_process_that_ignores_sigterm(make_driver: DriverFactory) -> None:
    stubborn = "trap '' TERM; while :; do sleep 1; done"
    async with make_driver(script=stubborn) as driver:
        req = request()
        await driver.create(req)
        (pid,) = driver_pids(driver)
        assert await driver.delete(req.sandbox_id)
        assert not alive(pid)


async def test_dying_before_registration_fails_with_stderr(make_driver: DriverFactory) -> None:
    crash = "echo 'supervisor: cannot import grpc' >&2; exit 3"
    async with make_driver(script=crash) as driver:
        events = driver.watch()
        req = request()
        await driver.create(req)
        failed = await next_event(events, lambda e: e.sandbox is not None and e.sandbox.state is BackendState.FAILED)
        assert failed.sandbox is not None
        assert "status 3" in failed.sandbox.message
        assert "cannot import grpc" in failed.sandbox.message
        view = await driver.get(req.sandbox_id)
        assert view is not None
        assert view.state is BackendState.FAILED


async def test_exit_after_registration_is_exited(make_driver: DriverFactory, paths: StatePaths) -> None:
    # Registers (the test authenticates for it), then ends once told to through the workspace.
    script = "while [ ! -e /workspace/stop ]; do sleep 0.01; done; exit 0"
    async with make_driver(script=script) as driver:
        events = driver.watch()
        created = await driver.create(request())
        workspace = workspace_of(paths, created.instance_id)
        credential = await read_when_present(credential_of(paths, created.instance_id))
        identity = await driver.identity.authenticate(credential)
        assert identity is not None
        driver.identity.registered(identity)  # what RegisterSupervisor does next
        (workspace / "stop").touch()
        exited = await next_event(events, lambda e: e.sandbox is not None and e.sandbox.state is BackendState.EXITED)
        assert exited.sandbox is not None
        assert "status 0" in exited.sandbox.message


async def test_credentials_are_per_instance(make_driver: DriverFactory, paths: StatePaths) -> None:
    async with make_driver() as driver:
        a = await driver.create(request())
        b = await driver.create(request())
        cred_a = await read_when_present(credential_of(paths, a.instance_id))
        cred_b = await read_when_present(credential_of(paths, b.instance_id))
        assert cred_a != cred_b
        # b's secret under a's instance id is refused, as is a garbled one.
        forged = f"wsl1.{a.instance_id}.{cred_b.rsplit('.', 1)[1]}"
        with pytest.raises(PermissionDeniedError):
            await driver.identity.authenticate(forged)
        with pytest.raises(PermissionDeniedError):
            await driver.identity.authenticate(cred_a + "x")
        assert await driver.identity.authenticate("eyJhbGciOi.some.jwt") is None


async def test_sandbox_is_isolated(make_driver: DriverFactory, paths: StatePaths) -> None:
    (paths.root / "api-token").write_text("secret-token")
    probe = (
        f"test -e {paths.root}/api-token && echo visible > /workspace/token || true; "
        "touch /etc/warmshell-probe 2>/dev/null && echo writable > /workspace/etc || true; "
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' > /workspace/ifaces; "
        "echo $$ > /workspace/pid; "
        "ls /run > /workspace/run; "
        "touch /tmp/warmshell-probe-$WARMSHELL_INSTANCE_ID && touch /workspace/tmp; "
        "mv /workspace/ifaces /workspace/done; exec sleep 600"
    )
    async with make_driver(script=probe) as driver:
        created = await driver.create(request())
        (isolated,) = [c for c in created.conditions if c.type == "Isolated"]
        assert (isolated.status, isolated.reason) == ("True", "Bubblewrap")
        assert "supervisor outside" in isolated.message
        workspace = workspace_of(paths, created.instance_id)
        ifaces = await read_when_present(workspace / "done")
        assert not (workspace / "token").exists(), "the state directory must not be there"
        assert not (workspace / "etc").exists(), "the root must be read-only"
        assert ifaces.split() == ["lo"], "no network but loopback"
        assert int((workspace / "pid").read_text()) < 10, "own pid namespace"
        assert (workspace / "run").read_text().split() == ["warmshell"], "only the agent under /run"
        assert (workspace / "tmp").exists(), "/tmp is private and writable"
        assert not Path(f"/tmp/warmshell-probe-{created.instance_id}").exists()


async def test_restart_reports_lost_sandboxes(make_driver: DriverFactory, paths: StatePaths) -> None:
    req = request()
    first = make_driver()
    async with first:
        created = await first.create(req)
        (pid,) = driver_pids(first)
    assert not alive(pid)
    assert (paths.instances / f"{created.instance_id}.json").exists()
    assert not workspace_of(paths, created.instance_id).exists(), "a dead sandbox's workspace goes"

    second = make_driver()
    async with second:
        lost = await second.get(req.sandbox_id)
        assert lost is not None
        assert lost.state is BackendState.FAILED
        assert "previous gateway" in lost.message
        assert [s.sandbox_id for s in await second.list()] == [req.sandbox_id]
        assert not (paths.instances / f"{created.instance_id}.json").exists()
        assert not (paths.sandboxes / created.instance_id).exists()
        events = second.watch()
        assert await second.delete(req.sandbox_id) is True
        assert (await next_event(events, lambda e: e.deleted)).sandbox_id == req.sandbox_id
        assert await second.get(req.sandbox_id) is None


async def test_limits_without_cgroups_are_refused_or_a_condition(make_driver: DriverFactory) -> None:
    spec = SandboxSpec(resources=Resources(cpu="200m", memory="64Mi"))
    async with make_driver(config=LocalDriverConfig()) as strict:
        with pytest.raises(
            FailedPreconditionError, match=r"^spec\.resources\.memory: this host cannot enforce it \(test host"
        ):
            await strict.create(request(spec=spec))
    async with make_driver(config=LocalDriverConfig(allow_unenforced_limits=True)) as driver:
        created = await driver.create(request(spec=spec))
        (condition,) = [c for c in created.conditions if c.type == "ResourceLimits"]
        assert (condition.status, condition.reason) == ("False", "CgroupUnavailable")
        # Every sandbox says what bounds it, limits asked for or not.
        plain = await driver.create(request())
        assert [c.type for c in plain.conditions] == ["Isolated", "ResourceLimits"]
        (bounds,) = [c for c in plain.conditions if c.type == "ResourceLimits"]
        assert bounds.message.startswith("enforced: /workspace 1Gi, /tmp 256Mi, /run 16Mi, /dev/shm 64Mi (tmpfs)")
        assert "Not enforced: memory 2Gi, cpu 1 (" in bounds.message


async def test_limits_with_cgroup_v2(make_driver: DriverFactory, tmp_path: Path) -> None:
    # A fake delegated hierarchy: plain files where cgroupfs would have its control files.
    root = tmp_path / "cgroup"
    (root / "gw").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "gw" / "cgroup.controllers").write_text("cpu memory pids\n")
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text("0::/gw\n")
    cgroup = cgroups.detect(root, self_cgroup, gateway="gw-1")
    assert isinstance(cgroup, cgroups.CgroupV2)

    async with make_driver(config=LocalDriverConfig(), cgroup=cgroup) as driver:
        spec = SandboxSpec(resources=Resources(cpu="0.2", memory="64Mi"))
        created = await driver.create(request(spec=spec))
        assert [(c.type, c.status) for c in created.conditions] == [("Isolated", "True"), ("ResourceLimits", "True")]
        sandbox_cgroup = root / "gw" / "warmshell" / "gw-1" / created.instance_id
        assert (sandbox_cgroup / "cpu.max").read_text() == "20000 100000\n"
        assert (sandbox_cgroup / "memory.max").read_text() == f"{64 * 2**20}\n"
        assert (sandbox_cgroup / "pids.max").read_text() == "1024\n"  # the default
        # The process moved itself in before exec'ing bwrap (same pid).
        (pid,) = driver_pids(driver)
        procs = await read_when_present(sandbox_cgroup / "cgroup.procs")
        await wait_until(lambda: (sandbox_cgroup / "cgroup.procs").read_text().strip() != "")
        assert (sandbox_cgroup / "cgroup.procs").read_text().strip() == str(pid), procs


async def test_what_is_enforced_is_said_once_at_start(
    make_driver: DriverFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="warmshell.drivers.local.driver"):
        async with make_driver(config=LocalDriverConfig()) as driver:
            await driver.create(request())
            await driver.create(request())
    said = [r for r in caplog.records if r.getMessage().startswith("local sandboxes: ")]
    assert len(said) == 1
    assert said[0].levelno == logging.WARNING  # memory and cpu are not enforced on this host
    assert "local sandboxes: enforced: /workspace 1Gi, /tmp 256Mi" in said[0].getMessage()
    assert "Not enforced: memory 2Gi, cpu 1 (test host: no cgroup v2)." in said[0].getMessage()


async def test_a_cgroup_that_cannot_be_made_is_said_exactly(make_driver: DriverFactory, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    cgroup = cgroups.CgroupV2(tmp_path / "a-file" / "warmshell")  # every mkdir under it fails
    async with make_driver(config=LocalDriverConfig(), cgroup=cgroup) as driver:
        created = await driver.create(request())
        (condition,) = [c for c in created.conditions if c.type == "ResourceLimits"]
        assert (condition.status, condition.reason) == ("False", "CgroupSetupFailed")
        assert condition.message.startswith("enforced: /workspace 1Gi, /tmp 256Mi")
        assert "Not enforced: memory 2Gi, cpu 1 (its cgroup could not be set up: " in condition.message
        assert created.state in (BackendState.PENDING, BackendState.RUNNING)  # it runs without


async def test_unisolated_mode_runs_plain_processes(make_driver: DriverFactory, paths: StatePaths) -> None:
    config = LocalDriverConfig(bwrap="/nonexistent/bwrap", allow_unisolated=True)
    # Written aside and renamed into place: a shell's `>` makes the file before it writes to it.
    async with make_driver(script="pwd > where.new && mv where.new where; exec sleep 600", config=config) as driver:
        created = await driver.create(request())
        (isolated,) = [c for c in created.conditions if c.type == "Isolated"]
        assert (isolated.status, isolated.reason) == ("False", "Unisolated")
        credential = await read_when_present(credential_of(paths, created.instance_id))
        assert await driver.identity.authenticate(credential)
        workspace = paths.sandboxes / created.instance_id / "workspace"  # no sandbox uid unisolated
        assert (await read_when_present(workspace / "where")).strip() == str(workspace)


def test_missing_bwrap_refuses_to_start(paths: StatePaths) -> None:
    with pytest.raises(Exception, match=r"local\.allow_unisolated") as caught:
        LocalDriver(LocalDriverConfig(bwrap="/nonexistent/bwrap"), paths)
    assert "bubblewrap" in str(caught.value)


async def test_spawn_failure_raises_and_leaves_nothing(make_driver: DriverFactory, paths: StatePaths) -> None:
    config = LocalDriverConfig(bwrap="/bin/false")  # "bubblewrap" that exits at once
    async with make_driver(config=config) as driver:
        req = request()
        with pytest.raises(Exception, match="cannot start a local sandbox"):
            await driver.create(req)
        assert await driver.get(req.sandbox_id) is None
        assert os.listdir(paths.sandboxes) == []
        assert not paths.instances.exists() or os.listdir(paths.instances) == []


def test_a_missing_agent_names_the_build_step(paths: StatePaths, tmp_path: Path) -> None:
    with pytest.raises(FailedPreconditionError, match=r"scripts/build-agent"):
        LocalDriver(LocalDriverConfig(), paths, agent=tmp_path / "no-agent")


def test_an_extra_bind_may_not_expose_the_state_dir(paths: StatePaths) -> None:
    with pytest.raises(FailedPreconditionError, match=r"local\.extra_ro_binds"):
        LocalDriver(LocalDriverConfig(extra_ro_binds=[paths.root.parent]), paths)


def make_image(root: Path) -> Path:
    """A tiny root filesystem: dash and the libraries it loads, copied from the host."""
    ldd = subprocess.run(["ldd", "/usr/bin/dash"], capture_output=True, text=True, check=True)
    needed = [word for word in ldd.stdout.split() if word.startswith("/")]
    for top in ("bin", "lib", "lib64"):
        (root / "usr" / top).mkdir(parents=True, exist_ok=True)
        (root / top).symlink_to(f"usr/{top}")
    for path in [*needed, "/usr/bin/sh"]:
        first, rest = path.strip("/").split("/", 1)
        target = root / ("usr/" + first if first != "usr" else first) / rest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(path), target)
    (root / "etc").mkdir()
    (root / "etc" / "image-marker").write_text("from the image\n")
    (root / "root").mkdir()
    return root


async def test_image_root_replaces_the_host_root(make_driver: DriverFactory, paths: StatePaths) -> None:
    # The sandbox's own uid resolves the image's path, so it lives where that uid can reach it.
    with tempfile.TemporaryDirectory(prefix="warmshell-image-") as base:
        os.chmod(base, 0o755)
        image = make_image(Path(base) / "image")
        # Shell builtins only: the image has nothing but sh.
        script = (
            "[ -e /etc/image-marker ] && echo yes > /workspace/marker; "
            "[ -e /usr/bin/dash ] || echo no > /workspace/host-usr; "
            "[ -e /usr/bin/sh ] && echo yes > /workspace/sh; : > /workspace/done"
        )
        async with make_driver(
            script=script, config=LocalDriverConfig(workspace_size="", image_roots=[Path(base)])
        ) as driver:
            spec = SandboxSpec(image=str(image))
            driver.validate("default", spec)
            created = await driver.create(request(spec=spec))
            workspace = workspace_of(paths, created.instance_id)
            # No mv in this image to rename files into place: `done` is written after all the others.
            await read_when_present(workspace / "done")
            assert (workspace / "marker").read_text() == "yes\n", "/etc comes from the image"
            assert (workspace / "host-usr").read_text() == "no\n", "/usr comes from the image"
            assert (workspace / "sh").read_text() == "yes\n"


async def test_delete_during_create_leaves_nothing(make_driver: DriverFactory) -> None:
    async with make_driver() as driver:
        req = request()
        created, deleted = await asyncio.gather(driver.create(req), driver.delete(req.sandbox_id))
        assert created.sandbox_id == req.sandbox_id
        assert deleted is True
        assert await driver.get(req.sandbox_id) is None
        assert driver_pids(driver) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root gateway runs sandboxes as other uids")
async def test_an_agent_under_a_private_directory_still_starts(make_driver: DriverFactory, tmp_path: Path) -> None:
    # A checkout under /root (or pytest's 0700 tmp): the sandbox's uid could not reach the agent
    # there, so the driver stages a copy where it can.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    agent = private / "warmshell-agent"
    shutil.copy(launching.AGENT_BINARY, agent)

    async def supervise(seat: Seat) -> int:
        return (await seat.runner(["true"], env={}, cwd="/", sink=lambda *_: asyncio.sleep(0))).exit_code

    driver = LocalDriver(
        LocalDriverConfig(),
        StatePaths(tmp_path / "state-private"),
        supervise=supervise,
        agent=agent,
        cgroup=cgroups.Unavailable("test"),
    )
    (tmp_path / "state-private").mkdir()
    async with driver:
        events = driver.watch()
        await driver.create(request())
        exited = await next_event(events, lambda e: e.sandbox is not None and e.sandbox.state is BackendState.FAILED)
        assert exited.sandbox is not None
        assert "supervisor exited with status 0" in exited.sandbox.message
