"""What an image sandbox runs and where, through a real gateway: the image's Entrypoint + Cmd when
the request names no command (the request's command replaces both, as a Kubernetes `command`
does), nothing at all with `no_command`, the same at activation for a warm pool member as for a
cold start; and the image's WorkingDir made when its layers lack it, owned by its User."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from tests.helpers.gateway import RunningGateway, pool_named, running_gateway, wait_pools
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, sh
from warmshell.api.v1 import sandbox_pb2 as pb

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="written for a root gateway (a uid per sandbox); a normal user's: test_image_user_gateway.py",
    ),
]

# What the image runs by default: it leaves the sandbox's name (known only once activated) and
# its arguments in /tmp/ran, then stays.
ENTRYPOINT = ["/bin/sh", "-c", 'echo "$WARMSHELL_SANDBOX_NAME $0 $1" > /tmp/ran; exec sleep 600']
CMD = ["from-cmd", "second"]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def created(gw: RunningGateway, name: str, **spec: object) -> pb.Sandbox:
    await gw.create(name=name, spec=pb.SandboxSpec(**spec))  # type: ignore[arg-type]
    sandbox = await gw.wait_ready(name)
    assert sandbox.status.phase == pb.SANDBOX_PHASE_READY, sandbox
    return sandbox


async def ran(gw: RunningGateway, name: str) -> str:
    """What the workload left in /tmp/ran ("" when nothing ran), once it has written it."""
    code, out, _ = await sh(
        gw, name, "for _ in $(seq 100); do [ -s /tmp/ran ] && break; sleep 0.05; done; cat /tmp/ran"
    )
    return out.strip() if code == 0 else ""


async def test_no_command_runs_the_images_entrypoint_and_cmd_and_get_shows_it(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny", Env=["PATH=/usr/bin:/bin"], Entrypoint=ENTRYPOINT, Cmd=CMD)
    async with running_gateway(state) as gw:
        sandbox = await created(gw, "defaulted", image="tiny:1")
        assert list(sandbox.spec.command) == [*ENTRYPOINT, *CMD]  # what runs, as `sandbox get` shows it
        assert (await gw.get("defaulted")).spec.command == sandbox.spec.command
        assert await ran(gw, "defaulted") == "defaulted from-cmd second"
        # A request's command replaces Entrypoint and Cmd both.
        mine = ["/bin/sh", "-c", 'echo "$WARMSHELL_SANDBOX_NAME mine" > /tmp/ran; exec sleep 600']
        sandbox = await created(gw, "own", image="tiny:1", command=mine)
        assert list(sandbox.spec.command) == mine
        assert await ran(gw, "own") == "own mine"
        # no_command: the agent alone; execs work, nothing of the image's ran.
        sandbox = await created(gw, "idle", image="tiny:1", no_command=True)
        assert (list(sandbox.spec.command), sandbox.spec.no_command) == ([], True)
        assert await sh(gw, "idle", "cat /tmp/ran 2>/dev/null || echo nothing; cat /proc/1/comm") == (
            0,
            "nothing\nwarmshell-agent\n",
            "",
        )


async def test_an_image_without_entrypoint_or_cmd_idles_and_no_command_with_a_command_is_refused(
    state: Path, tmp_path: Path
) -> None:
    import_tiny(state, tmp_path / "tiny", Env=["PATH=/usr/bin:/bin"])
    async with running_gateway(state) as gw:
        sandbox = await created(gw, "plain", image="tiny:1")
        assert list(sandbox.spec.command) == []
        assert (await sh(gw, "plain", "echo here"))[1] == "here\n"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.create(name="both", spec=pb.SandboxSpec(image="tiny:1", command=["/bin/true"], no_command=True))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (caught.value.details() or "").startswith("spec.no_command: "), caught.value.details()


async def test_an_image_whose_cmd_exits_makes_an_exited_sandbox_as_docker_would(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny", Env=["PATH=/usr/bin:/bin"], Cmd=["/bin/sh", "-c", "exit 3"])
    async with running_gateway(state) as gw:
        await gw.create(name="short", spec=pb.SandboxSpec(image="tiny:1"))
        ended = await gw.wait_for("short", lambda s: s.status.phase == pb.SANDBOX_PHASE_EXITED)
        assert ended.status.exit_code == 3


async def test_a_warm_member_of_an_image_pool_runs_the_images_command_when_claimed(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny", Env=["PATH=/usr/bin:/bin"], Entrypoint=ENTRYPOINT, Cmd=CMD)
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "tiny.toml").write_text('version = 1\nworkspace = "default"\nreplicas = 2\nimage = "tiny:1"\n')
    settings = {"local.pools_dir": str(pools), "local.pool_reload_interval_seconds": 0.1}
    async with running_gateway(state, **settings) as gw:
        await wait_pools(gw, lambda r: (p := pool_named(r, "tiny")) is not None and p.idle >= 2)
        warm = await created(gw, "warm", image="tiny:1")
        assert (warm.status.allocation, list(warm.spec.command)) == ("warm", [*ENTRYPOINT, *CMD])
        # Started at the activation, not when the member started: it knows the sandbox's name.
        assert await ran(gw, "warm") == "warm from-cmd second"
        idle = await created(gw, "warm-idle", image="tiny:1", no_command=True)
        assert idle.status.allocation == "warm"
        assert (await sh(gw, "warm-idle", "cat /tmp/ran 2>/dev/null || echo nothing"))[1] == "nothing\n"


async def test_a_working_dir_the_image_lacks_is_made_owned_by_its_user(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny", Env=["PATH=/usr/bin:/bin"], WorkingDir="/srv/app/work", User="1234:55")
    async with running_gateway(state) as gw:
        await created(gw, "wd", image="tiny:1", command=["/bin/sh", "-c", "pwd > /tmp/ran; exec sleep 600"])
        assert await ran(gw, "wd") == "/srv/app/work"  # the workload's directory
        code, out, _ = await sh(gw, "wd", "pwd; ls -nd /srv/app/work /srv/app | cut -d' ' -f1,3,4")
        assert (code, out) == (0, "/srv/app/work\ndrwxr-xr-x 1234 55\ndrwxr-xr-x 1234 55\n")
        assert (await sh(gw, "wd", ": > /srv/app/work/mine && echo writable"))[1] == "writable\n"


async def test_a_working_dir_that_names_a_file_fails_the_start_naming_it(state: Path, tmp_path: Path) -> None:
    import_tiny(state, tmp_path / "tiny", Env=["PATH=/usr/bin:/bin"], WorkingDir="/etc/warmshell-test-marker/x")
    async with running_gateway(state) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gw.create(name="bad", spec=pb.SandboxSpec(image="tiny:1", no_command=True), wait_ready=True)
        details = caught.value.details() or ""
        assert "WorkingDir '/etc/warmshell-test-marker/x'" in details, details
