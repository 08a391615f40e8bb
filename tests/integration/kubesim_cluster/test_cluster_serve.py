"""``run_controllers`` as ``kubesim serve`` runs it: URL, admin token and an admin kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import subprocess
import sys
from collections.abc import Callable

from ksc_helpers import NS, pool, template, wait_for, wait_pool_ready

from kubesim import cluster, testing, timing
from kubesim.controllers import client as kc


async def _pools_served(api: kc.KubeClient) -> bool:
    try:
        await api.list_objects(kc.POOLS, NS)
    except kc.ApiError:
        return False
    return True


async def test_run_controllers_against_a_served_api(tmp_path: pathlib.Path) -> None:
    async with testing.running_apiserver() as server:
        admin = server.write_kubeconfig(tmp_path / "admin.yaml", admin=True)
        profile = dataclasses.replace(timing.FAST, api_latency=0.001)
        task = asyncio.create_task(
            cluster.run_controllers(url=server.url, token=server.admin_token, kubeconfig=str(admin), timing=profile)
        )
        api = kc.KubeClient.from_kubeconfig(str(admin))
        try:
            # The CRDs are installed by the controllers on start: wait for the kind to be served.
            await wait_for(lambda: _pools_served(api), bool, what="CRDs served")
            await api.create(kc.TEMPLATES, NS, template())
            await api.create(kc.POOLS, NS, pool(replicas=2))
            await wait_pool_ready(api, "pool", 2)
            assert server.faults.delay_for("get", "pods", "anyone") == 0.001
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.aclose()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


async def _until(check: Callable[[], bool], what: str, within: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, f"not {what} after {within:.0f} s"
        await asyncio.sleep(0.05)  # polling /proc: there is no event for another process's state


async def test_serve_runs_the_controllers_apart_and_they_never_outlive_it(tmp_path: pathlib.Path) -> None:
    serve = subprocess.Popen(
        [sys.executable, "-m", "kubesim.cli", "serve", "--kubeconfig", str(tmp_path / "kc.yaml")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def controllers() -> list[int]:
            return [
                p
                for p in _children(serve.pid)
                if b"controllers" in pathlib.Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            ]

        await _until(lambda: bool(controllers()), "started the controllers' process")
        (child,) = controllers()
        admin = kc.KubeClient.from_kubeconfig(str(tmp_path / "kc-admin.yaml"))
        try:
            # The child installs the CRDs through the API served by its parent.
            await wait_for(lambda: _pools_served(admin), bool, what="CRDs served")
        finally:
            await admin.aclose()
        serve.kill()  # no chance to stop its child: the pipe on the child's stdin closes instead
        serve.wait()
        await _until(lambda: not pathlib.Path(f"/proc/{child}").exists(), "stopped the orphaned controllers")
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
