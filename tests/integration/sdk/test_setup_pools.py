"""Profiles with `[setup]` against a real gateway process: the gateway builds the pool's image from
the steps, fills the pool from it, shows a failing step on the pool, rebuilds when a step changes
and reuses the built image after a restart."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

import warmshell
from tests.helpers import images
from tests.helpers.cli import CliGateway, start_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import tools_layer

pytestmark = [
    needs_bwrap,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]

_PROFILE = """version = 1
workspace = "default"
replicas = 1
[setup]
from = "tools:1"
copy = ["data.txt:/opt/data.txt"]
run = [{runs}]
"""


_NO_POOL = warmshell.PoolInfo(
    name="",
    workspace="",
    fingerprint="",
    image="",
    environment={},
    cpu="",
    memory="",
    desired=0,
    ready=0,
    idle=0,
    hits=0,
    misses=0,
    source="",
)


def _profile(pools: Path, name: str, *runs: str) -> None:
    (pools / f"{name}.toml").write_text(_PROFILE.format(runs=", ".join(f'"{run}"' for run in runs)))


def _until(what: str, check: Callable[[], warmshell.PoolInfo | None], timeout: float = 120.0) -> warmshell.PoolInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _pool(client: warmshell.Client, name: str) -> warmshell.PoolInfo:
    """The pool named so; an empty view until the profile is first read."""
    found = [p for p in client.pools() if p.name == name]
    return found[0] if found else dataclasses.replace(_NO_POOL, name=name)


def _ready(client: warmshell.Client, name: str, *, not_image: str = "") -> warmshell.PoolInfo:
    def check() -> warmshell.PoolInfo | None:
        pool = _pool(client, name)
        return pool if pool.ready >= 1 and pool.image.startswith("setup/") and pool.image != not_image else None

    return _until(f"pool {name} to be ready", check)


def _import_base(state_dir: Path, layout: Path) -> None:
    layer = tools_layer("base").tar()
    images.write_oci_layout(layout, [layer], config=images.config_json([layer], Env=["PATH=/usr/bin:/bin"]))
    with warmshell.Client(state_dir=state_dir) as client:
        client.images.import_(layout, name="tools:1")


def _builds(gateway: CliGateway) -> int:
    return gateway.log().count('"msg": "warm pool prepared: building image setup/')


def test_a_setup_profile_builds_fills_its_pool_rebuilds_on_change_and_survives_a_restart(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "data.txt").write_text("copied\n")
    _profile(pools, "prepared", "echo prepared > /workspace/marker", "cat /opt/data.txt >> /workspace/marker")
    state = tmp_path / "state"
    gateway = start_gateway(state, "--pools", str(pools))
    try:
        _import_base(state, tmp_path / "layout")  # (the profile waits for its base: ImageNotFound)
        with warmshell.Client(state_dir=state) as client:
            pool = _ready(client, "prepared")
            with client.create(name="warm", image=pool.image, auto_delete=True) as sandbox:
                assert sandbox.run(["/bin/sh", "-c", "cat /workspace/marker"]).stdout == b"prepared\ncopied\n"
            assert _pool(client, "prepared").hits == 1
            assert _builds(gateway) == 1

            _profile(pools, "prepared", "echo changed > /workspace/marker")
            changed = _ready(client, "prepared", not_image=pool.image)
            assert _builds(gateway) == 2
            with client.create(name="warm2", image=changed.image, auto_delete=True) as sandbox:
                assert sandbox.run(["/bin/sh", "-c", "cat /workspace/marker"]).stdout == b"changed\n"
    finally:
        assert gateway.stop() == 0, gateway.log()

    again = start_gateway(state, "--pools", str(pools))
    try:
        with warmshell.Client(state_dir=state) as client:
            assert _ready(client, "prepared").image == changed.image
        assert _builds(again) == 0, again.log()
    finally:
        assert again.stop() == 0, again.log()


def test_a_failing_step_shows_on_the_pool_and_bad_setups_name_their_field(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "data.txt").write_text("copied\n")
    _profile(pools, "broken", "true", "echo the-reason >&2; exit 3")
    (pools / "nocopy.toml").write_text(_PROFILE.format(runs='"true"').replace("data.txt", "missing.txt"))
    (pools / "norun.toml").write_text(_PROFILE.format(runs=""))
    (pools / "unknown.toml").write_text(_PROFILE.format(runs='"true"') + "colour = 'blue'\n")
    state = tmp_path / "state"
    gateway = start_gateway(state, "--pools", str(pools))
    try:
        _import_base(state, tmp_path / "layout")
        with warmshell.Client(state_dir=state) as client:

            def failed() -> warmshell.PoolInfo | None:
                pool = _pool(client, "broken")
                return pool if any(c.reason == "BuildFailed" for c in pool.conditions) else None

            condition = next(c for c in _until("BuildFailed", failed).conditions if c.reason == "BuildFailed")
            assert "step 3 (run 'echo the-reason >&2; exit 3') exited 3" in condition.message
            assert "the-reason" in condition.message
            assert "retrying in" in condition.message
            messages = {p.name: " ".join(c.message for c in p.conditions) for p in client.pools()}
            assert "setup.copy: 'missing.txt'" in messages["nocopy"]
            assert "does not exist" in messages["nocopy"]
            assert "setup.run: must be a non-empty list" in messages["norun"]
            assert "setup.colour: unknown key" in messages["unknown"]
        listed = gateway.run("pool", "list")
        assert "BuildFailed" in listed.stdout, listed.stdout
        address = json.loads((state / "gateway.json").read_text())["http"]
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            exposed = response.read().decode()
        assert 'warmshell_setup_builds_total{profile="broken",result="failed",step="3"}' in exposed
        assert 'warmshell_setup_build_seconds_count{profile="broken",result="failed"}' in exposed
        # The other pools and the gateway are unaffected: it still serves creates.
        with warmshell.Client(state_dir=state) as client, client.create(name="cold", image="tools:1") as sandbox:
            assert sandbox.run(["/bin/sh", "-c", "echo ok"]).stdout == b"ok\n"
            sandbox.delete()
    finally:
        assert gateway.stop() == 0, gateway.log()


def test_a_gateway_stopped_mid_build_leaves_nothing_the_next_start_keeps(tmp_path: Path) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "slow.toml").write_text(HEAD_SLOW)
    config = tmp_path / "gateway.toml"
    config.write_text("exec_drain_seconds = 0\n")  # (the build's step is stopped, not waited for)
    state = tmp_path / "state"

    def building(client: warmshell.Client) -> list[str]:
        _until("Building", lambda: _has(_pool(client, "slow"), "Building"))
        return [s.name for s in _until_listed(client)]

    gateway = start_gateway(state, "--config", str(config), "--pools", str(pools))
    try:
        _import_base(state, tmp_path / "layout")
        with warmshell.Client(state_dir=state) as client:
            first = building(client)
    finally:
        assert gateway.stop() == 0, gateway.log()
    again = start_gateway(state, "--config", str(config), "--pools", str(pools))
    try:
        with warmshell.Client(state_dir=state) as client:
            second = building(client)
            assert set(first).isdisjoint(second), (first, second)  # the one left behind is deleted
            assert len(second) == 1
    finally:
        assert again.stop() == 0, again.log()


HEAD_SLOW = 'version = 1\nworkspace = "default"\nreplicas = 1\n[setup]\nfrom = "tools:1"\nrun = ["sleep 600"]\n'


def _has(pool: warmshell.PoolInfo, reason: str) -> warmshell.PoolInfo | None:
    return pool if any(c.reason == reason for c in pool.conditions) else None


def _until_listed(client: warmshell.Client) -> list[warmshell.SandboxInfo]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = [s for s in client.list() if s.name.startswith("build-") and s.phase == warmshell.Phase.READY]
        if ready:
            return [s for s in client.list() if s.name.startswith("build-")]
        time.sleep(0.2)
    raise AssertionError("no build sandbox became Ready")
