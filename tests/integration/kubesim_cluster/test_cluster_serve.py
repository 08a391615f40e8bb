"""``kubesim serve`` runs the controllers in its process; ``run_controllers`` (``kubesim controllers``)
runs them against a served API over HTTP: URL, admin token and an admin kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import subprocess
import sys

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
        # The token's file is the owner's alone, and written whole (no temporary name left).
        assert admin.stat().st_mode & 0o777 == 0o600
        assert [f.name for f in tmp_path.iterdir()] == ["admin.yaml"]
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


async def test_serve_runs_the_controllers_in_its_own_process(tmp_path: pathlib.Path) -> None:
    serve = subprocess.Popen(
        [sys.executable, "-m", "kubesim.cli", "serve", "--kubeconfig", str(tmp_path / "kc.yaml")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_for(lambda: asyncio.sleep(0.05, (tmp_path / "kc.yaml").exists()), bool, what="kubeconfig")
        admin = kc.KubeClient.from_kubeconfig(str(tmp_path / "kc.yaml"))
        try:
            # The controllers install the CRDs through the API of the process they run in.
            await wait_for(lambda: _pools_served(admin), bool, what="CRDs served")
        finally:
            await admin.aclose()
        commands = [pathlib.Path(f"/proc/{p}/cmdline").read_bytes() for p in _children(serve.pid)]
        assert not [c for c in commands if b"kubesim.cli" in c], commands
    finally:
        serve.terminate()
        assert serve.wait(timeout=30) == 0
