"""``run_controllers`` as ``kubesim serve`` runs it: URL, admin token and an admin kubeconfig."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib

from ksc_helpers import NS, pool, template, wait_for, wait_pool_ready

from kubesim import cluster, testing, timing
from kubesim.controllers import client as kc


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
            async def served() -> bool:
                try:
                    await api.list_objects(kc.POOLS, NS)
                except kc.ApiError:
                    return False
                return True

            await wait_for(served, bool, what="CRDs served")
            await api.create(kc.TEMPLATES, NS, template())
            await api.create(kc.POOLS, NS, pool(replicas=2))
            await wait_pool_ready(api, "pool", 2)
            assert server.faults.delay_for("get", "pods", "anyone") == 0.001
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.aclose()
