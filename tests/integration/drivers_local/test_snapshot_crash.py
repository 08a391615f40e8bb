"""A gateway killed (SIGKILL) in the middle of a snapshot: after its restart no partial image is
listed, no staged or orphan layer is left in the store, no process of the sandbox survives (the
restart's cgroup sweep thaws and kills a sandbox left frozen), and the sandbox is in a defined
state (lost with the gateway, as every local sandbox is)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.cli import start_gateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="images of the image store need a gateway run as root"),
]
# No Cmd: a sandbox of the image runs nothing but its agent (a shell as Cmd would exit at once).
IDLE_ENV = ["PATH=/usr/bin:/bin"]


def _staged_layer(store: Path) -> bool:
    return any((stage / "layer").exists() for stage in (store / "staging").glob("import-*"))


def _descendants(root: int) -> set[int]:
    """The processes below `root` now."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _ended(pids: set[int], seconds: float = 10) -> set[int]:
    """Wait up to `seconds` for `pids` to end; those still alive."""
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "Z"


def test_a_gateway_killed_mid_snapshot_leaves_no_partial_image_and_no_orphan(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    store = state / "images"
    layers_before = sorted(p.name for p in (store / "layers" / "sha256").iterdir())
    gateway = start_gateway(state)
    try:
        created = gateway.run("sandbox", "create", "--name", "victim", "--image", "tiny:1")
        assert created.returncode == 0, created.stderr
        fill = gateway.run(
            "sandbox", "exec", "victim", "--", "/bin/sh", "-c", "head -c 300000000 /dev/zero > /workspace/big"
        )
        assert fill.returncode == 0, fill.stderr
        snapshot = gateway.popen("sandbox", "snapshot", "victim", "--as", "crashed:1")
        deadline = time.monotonic() + 60
        while not _staged_layer(store) and time.monotonic() < deadline and snapshot.poll() is None:
            time.sleep(0.005)
        assert _staged_layer(store), "the snapshot never reached its layer"
        sandbox_processes = _descendants(gateway.process.pid)
        assert sandbox_processes
        gateway.process.send_signal(signal.SIGKILL)
        gateway.process.wait()
        snapshot.communicate(timeout=30)
    finally:
        if gateway.process.poll() is None:
            gateway.stop()
    restarted = start_gateway(state)
    try:
        # A sandbox frozen when its gateway died cannot die (a cgroup v1 freezer keeps even a
        # SIGKILL pending): the next start's sweep of the gateway's cgroups thaws and kills it.
        assert _ended(sandbox_processes) == set()
        listed = restarted.run("image", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        assert "crashed:1" not in listed.stdout
        assert list((store / "staging").iterdir()) == []
        assert sorted(p.name for p in (store / "layers" / "sha256").iterdir()) == layers_before
        shown = json.loads(restarted.run("sandbox", "get", "victim", "-o", "json").stdout)
        assert shown["status"]["phase"] in ("SANDBOX_PHASE_ERROR", "SANDBOX_PHASE_FAILED"), shown["status"]
    finally:
        assert restarted.stop() == 0


def test_a_gateway_killed_mid_pause_or_mid_resume_leaves_a_defined_sandbox(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    store = state / "images"
    gateway = start_gateway(state)
    try:
        for name in ("pausing", "resuming"):
            assert gateway.run("sandbox", "create", "--name", name, "--image", "tiny:1").returncode == 0
        fill = "head -c 300000000 /dev/zero > /workspace/big"
        assert gateway.run("sandbox", "exec", "pausing", "--", "/bin/sh", "-c", fill).returncode == 0
        assert gateway.run("sandbox", "pause", "resuming").returncode == 0
        pausing = gateway.popen("sandbox", "pause", "pausing")
        deadline = time.monotonic() + 60
        while not _staged_layer(store) and time.monotonic() < deadline and pausing.poll() is None:
            time.sleep(0.005)
        assert _staged_layer(store), "the pause never reached its layer"
        resuming = gateway.popen("sandbox", "resume", "resuming")
        time.sleep(0.05)
        sandbox_processes = _descendants(gateway.process.pid)
        gateway.process.send_signal(signal.SIGKILL)
        gateway.process.wait()
        pausing.communicate(timeout=30)
        resuming.communicate(timeout=30)
    finally:
        if gateway.process.poll() is None:
            gateway.stop()
    restarted = start_gateway(state)
    try:
        assert _ended(sandbox_processes) == set()
        listed = json.loads(restarted.run("sandbox", "list", "-o", "json").stdout)
        phases = {s["name"]: s["status"]["phase"] for s in listed["sandboxes"]}
        # Lost with its gateway before its pause was recorded; or Paused, its layer committed.
        assert phases["pausing"] in ("SANDBOX_PHASE_ERROR", "SANDBOX_PHASE_PAUSED"), phases
        # A resume is recorded only once its new runtime answered: else it is still Paused.
        assert phases["resuming"] in ("SANDBOX_PHASE_PAUSED", "SANDBOX_PHASE_ERROR"), phases
        assert restarted.run("image", "list").returncode == 0  # opens the store: leftovers collected
        assert list((store / "staging").iterdir()) == []
        if phases["resuming"] == "SANDBOX_PHASE_PAUSED":
            again = restarted.run("sandbox", "resume", "resuming")
            assert again.returncode == 0, again.stderr
        for name in ("pausing", "resuming"):
            assert restarted.run("sandbox", "delete", name).returncode == 0
        # What is left beside the base is untagged (a resumed sandbox's old files): prune takes it.
        assert json.loads((store / "index.json").read_text())["tags"].keys() == {"tiny:1"}
        assert restarted.run("image", "prune").returncode == 0
        assert len(json.loads((store / "index.json").read_text())["images"]) == 1
    finally:
        assert restarted.stop() == 0


def test_a_gateway_killed_mid_fork_leaves_no_child_running_and_no_partial_image(tmp_path: Path) -> None:
    state = tmp_path / "state"
    import_tiny(state, tmp_path / "tiny", Env=IDLE_ENV)
    store = state / "images"
    gateway = start_gateway(state)
    try:
        assert gateway.run("sandbox", "create", "--name", "parent", "--image", "tiny:1").returncode == 0
        fill = "head -c 300000000 /dev/zero > /workspace/big"
        assert gateway.run("sandbox", "exec", "parent", "--", "/bin/sh", "-c", fill).returncode == 0
        forking = gateway.popen("sandbox", "fork", "parent", "--count", "3")
        deadline = time.monotonic() + 60
        while not _staged_layer(store) and time.monotonic() < deadline and forking.poll() is None:
            time.sleep(0.005)
        assert _staged_layer(store), "the fork never reached its snapshot's layer"
        sandbox_processes = _descendants(gateway.process.pid)
        gateway.process.send_signal(signal.SIGKILL)
        gateway.process.wait()
        forking.communicate(timeout=30)
    finally:
        if gateway.process.poll() is None:
            gateway.stop()
    restarted = start_gateway(state)
    try:
        assert _ended(sandbox_processes) == set()
        listed = json.loads(restarted.run("sandbox", "list", "-o", "json").stdout)
        assert {s["name"] for s in listed["sandboxes"]} == {"parent"}  # no child was recorded
        assert listed["sandboxes"][0]["status"]["phase"] == "SANDBOX_PHASE_ERROR"  # lost with its gateway
        assert restarted.run("image", "list").returncode == 0
        assert list((store / "staging").iterdir()) == []
        assert len(json.loads((store / "index.json").read_text())["images"]) == 1
    finally:
        assert restarted.stop() == 0
