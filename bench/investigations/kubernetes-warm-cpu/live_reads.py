"""Where the gateway's live Kubernetes reads come from during concurrent warm creates.

`python bench/investigations/kubernetes-warm-cpu/live_reads.py CREATES RATE POOL`: kubesim
(`default` timing) in a process of its own, the gateway in this one with `Kube.get` and
`Kube.list` wrapped to count each call by its warmshell call site (the innermost four frames
outside `kube.py`), then CREATES warm creates sent at RATE/s against a pool of POOL, each deleted
once Ready. Prints the reads per create by call site. (The early pod read of a registration runs
in a task of its own: its call site prints empty.)
"""

from __future__ import annotations

import asyncio
import collections
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from kubesim.controllers import client as kc  # noqa: E402
from tests.helpers.gateway import RunningGateway, running_gateway  # noqa: E402
from tests.helpers.kubesim_process import kubesim_process  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import IMAGE, NAMESPACE, driver_config, gateway_settings  # noqa: E402
from warmshell.api.v1 import sandbox_pb2 as pb  # noqa: E402
from warmshell.core.fingerprints import SandboxShape  # noqa: E402
from warmshell.drivers.kubernetes import KubernetesDriver, kube  # noqa: E402
from warmshell.drivers.kubernetes.warm import warmpools  # noqa: E402

POOL = "bench"
ENV = {"FOO": "bar"}
SITES: collections.Counter[tuple[str, str, str]] = collections.Counter()


def _site() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "/warmshell/" in f.filename and "kube.py" not in f.filename]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in frames[-4:][::-1])


def _count_reads() -> None:
    get, list_ = kube.Kube.get, kube.Kube.list

    async def counted_get(self: kube.Kube, resource: kube.Resource, namespace: str, name: str) -> Any:
        SITES[("get", resource.plural, _site())] += 1
        return await get(self, resource, namespace, name)

    async def counted_list(self: kube.Kube, resource: kube.Resource, *args: Any, **kwargs: Any) -> Any:
        SITES[("list", resource.plural, _site())] += 1
        return await list_(self, resource, *args, **kwargs)

    kube.Kube.get, kube.Kube.list = counted_get, counted_list  # type: ignore[method-assign]


async def _one(gw: RunningGateway, name: str) -> str:
    await gw.create(name=name, spec=pb.SandboxSpec(environment=ENV))
    ready = await gw.wait_ready(name, timeout=60)
    await gw.delete(name)
    return str(ready.status.allocation)


async def main(creates: int, rate: float, pool: int) -> None:
    _count_reads()
    async with kubesim_process("default") as cluster:
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp) / "state"
            shape = SandboxShape(workspace="default", image=IMAGE, environment=ENV)
            config = driver_config(cluster, state)
            template, pool_obj = warmpools.render_pool_pair(
                config, name=POOL, namespace=NAMESPACE, shape=shape, replicas=pool
            )
            await cluster.admin.create(kc.TEMPLATES, NAMESPACE, template)
            await cluster.admin.create(kc.POOLS, NAMESPACE, pool_obj)
            async with running_gateway(state, **gateway_settings(cluster, state)) as gw:
                driver = gw.gateway.parts.driver
                assert isinstance(driver, KubernetesDriver)
                async with asyncio.timeout(300):
                    while not any(p.name == POOL and p.idle >= pool for p in driver.pools()):
                        await asyncio.sleep(0.05)  # the idle count has no change notification
                SITES.clear()
                tasks = []
                for i in range(creates):
                    tasks.append(asyncio.create_task(_one(gw, f"w{i}")))
                    await asyncio.sleep(1 / rate)  # the arrival schedule itself
                allocations = collections.Counter(await asyncio.gather(*tasks))
    print(f"{creates} creates at {rate:g}/s, pool {pool}: {dict(allocations)}")
    for (verb, plural, site), count in SITES.most_common():
        print(f"{count / creates:5.2f}/create {verb} {plural}: {site}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
