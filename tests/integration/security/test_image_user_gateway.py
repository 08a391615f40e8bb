"""Sandboxes from an image on a gateway of a normal user: a real `warmshell gateway start` run as
`nobody` (the launcher mounts the image's overlay in a user namespace of its own, where the
store's owner is 0), driven over its socket. The image's layers stay read-only and untouched,
each sandbox writes into its own upper layer only, the image's User and WorkingDir hold, and
neither the host's /usr nor the store is reachable from inside, nor can a mount be loosened."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from tests.helpers.gateway import RunningGateway
from tests.integration.drivers_local.support import needs_bwrap
from tests.integration.drivers_local.test_image_sandboxes import import_tiny, sh
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.api.v1 import sandbox_pb2_grpc
from warmshell.drivers.local import admission

ROOT = Path(__file__).resolve().parents[3]
# The user the gateway runs as, and an interpreter it may run (the tests' own may live under a
# home directory only root can enter): the system's, with this tree and its packages on its path.
USER = "nobody"
PYTHON = "/usr/bin/python3"

pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root"),
    pytest.mark.skipif(admission.userns_overlay_refused(os.uname().release) is not None, reason="Linux < 5.11"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing"),
]


def _as_user() -> list[str]:
    user = pwd.getpwnam(USER)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]


def _environment(state: Path) -> dict[str, str]:
    site = [p for p in sys.path if p.endswith("site-packages")]
    return {"PATH": "/usr/bin:/bin", "HOME": str(state), "PYTHONPATH": ":".join([str(ROOT / "src"), *site])}


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory the gateway's user can reach (pytest's are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="ws-user-gateway-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _user_can_run_python(state: Path) -> Iterator[None]:
    probe = subprocess.run(
        [*_as_user(), PYTHON, "-c", "import warmshell.gateway.server"],
        env=_environment(state),
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"{USER} cannot run {PYTHON} with this tree's packages: {probe.stderr[-300:]}")
    yield


@asynccontextmanager
async def user_gateway(state: Path) -> AsyncIterator[RunningGateway]:
    """`warmshell gateway start` as the user, on `state` (which it owns)."""
    log = (state.parent / "gateway.log").open("wb")
    argv = [*_as_user(), PYTHON, "-m", "warmshell", "gateway", "start", "--state-dir", str(state), "--http-port", "0"]
    process = subprocess.Popen(argv, env=_environment(state), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (state / "gateway.json").exists():
            assert process.poll() is None, (state.parent / "gateway.log").read_text()
            assert time.monotonic() < deadline, (state.parent / "gateway.log").read_text()
            time.sleep(0.05)
        channel = grpc.aio.insecure_channel(f"unix://{state / 'gateway.sock'}")
        token = (state / "api-token").read_text().strip()
        try:
            # Only the stub and its token are used: the gateway is another process.
            yield RunningGateway(cast(Any, None), sandbox_pb2_grpc.SandboxServiceStub(channel), channel, token)
        finally:
            await channel.close(grace=None)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def test_a_gateway_of_a_normal_user_runs_image_sandboxes_in_its_own_user_namespace(work: Path) -> None:
    state = work / "state"
    import_tiny(state, work / "tiny", Env=["PATH=/usr/bin:/bin"], User="1234:55", WorkingDir="/srv/app")
    user = pwd.getpwnam(USER)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(state)], check=True)
    layer = next((state / "images" / "layers" / "sha256").iterdir())
    before = {p.relative_to(layer): p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    with _user_can_run_python(state):
        async with user_gateway(state) as gw:
            for name in ("one", "two"):
                await gw.create(name=name, spec=pb.SandboxSpec(image="tiny:1", no_command=True))
                ready = await gw.wait_ready(name, timeout=60)
                assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
            script = "id -u; id -g; pwd; ls -nd /srv/app /etc | cut -d' ' -f3,4; cat /etc/warmshell-test-marker"
            assert await sh(gw, "one", script) == (0, "1234\n55\n/srv/app\n1234 55\n1234 55\nbuilt by the tests", "")
            code, out, err = await sh(
                gw, "one", "echo changed > /etc/warmshell-test-marker && cat /etc/warmshell-test-marker"
            )
            assert (code, out, err) == (0, "changed\n", "")
            assert (await sh(gw, "two", "cat /etc/warmshell-test-marker"))[1] == "built by the tests"
            unreachable = f"ls {state}/images 2>/dev/null || echo no-store; [ -e /usr/bin/python3 ] || echo no-host-usr"
            assert (await sh(gw, "one", unreachable))[1] == "no-store\nno-host-usr\n"
            # No way to loosen the mounts from inside: no capability in any namespace.
            attempts = (
                "mount -o remount,suid / 2>/dev/null || echo refused; umount /workspace 2>/dev/null || echo refused"
            )
            assert (await sh(gw, "one", attempts))[1] == "refused\nrefused\n"
            # The root is the overlay, nosuid (its layers too, beneath it).
            code, out, _ = await sh(gw, "one", "grep ' / ' /proc/self/mountinfo")
            assert "nosuid" in out.split(" - ")[0], out
            assert " - overlay " in out, out
    after = {p.relative_to(layer): p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    assert after == before  # nothing reached the store
