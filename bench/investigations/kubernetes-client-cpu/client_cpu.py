"""The gateway's Kubernetes client CPU per request and per watch event, the adapter's way against
kubernetes_asyncio's `call_api` way (the tree before this investigation), in one process,
interleaved in blocks so both see the same load: `kube.Kube` against `kubesim serve` in its own
process, over TLS as the gateway reaches it.

- GET: sequential GETs of one ConfigMap the size of a pod (~3.5 KB of JSON);
- POST: creates of a small ConfigMap (a TokenReview's or a claim's size);
- watch: a child process patches the big ConfigMap continuously while this process watches the
  ConfigMaps, one way for a block of events, then the other (the ways differ only in how the
  watch request is sent; each event is read and decoded by the same code).

Each figure is this process's CPU (user + system, `resource.getrusage`) per request or per event
received, summed over the blocks of each way: the client's whole cost (TLS, HTTP, the adapter,
JSON), kubesim's apart. Also printed: the TLS connections the adapter opened (one per concurrent
request or watch, reused after).

    python bench/investigations/kubernetes-client-cpu/client_cpu.py [--blocks 10] [--block 100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT)]

from kubesim.controllers import client as kc  # noqa: E402
from tests.helpers.kubesim_process import kubesim_process  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import NAMESPACE  # noqa: E402
from warmshell.core.config import KubernetesDriverConfig  # noqa: E402
from warmshell.drivers.kubernetes import kube  # noqa: E402

BIG = "ws-client-cpu-big"
# A pod's size as the gateway's watches carry it on kubesim (~3.5 KB of JSON).
PAYLOAD = {f"k{i}": "x" * 60 for i in range(50)}

WRITER = """
import asyncio, sys
from kubesim.controllers import client as kc
async def main(kubeconfig, namespace, name):
    api = kc.KubeClient.from_kubeconfig(kubeconfig)
    i = 0
    while True:
        i += 1
        await api.patch(kc.CONFIGMAPS, namespace, name, {"data": {"seq": str(i)}})
        await asyncio.sleep(0.002)
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


def cpu() -> float:
    """This process's CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the way before: kubernetes_asyncio's call_api, aiohttp's line iterator -------------------------


async def call_api(api: kube.Kube, method: str, path: str, body: Any = None, query: Any = (), limits: Any = 5.0) -> Any:
    """A request as the adapter sent it before: through `ApiClient.call_api`."""
    return await api._api.call_api(
        path,
        method,
        query_params=list(query),
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=limits,
    )


async def request_before(api: kube.Kube, method: str, path: str, body: Any = None) -> Any:
    """One request and its decoded answer, the way before."""
    response = await call_api(api, method, path, body)
    try:
        data = await response.read()
    finally:
        response.release()
    return orjson.loads(data)


async def watch_before(api: kube.Kube, version: str) -> AsyncIterator[Any]:
    """Watch events of the ConfigMaps, the way before: the stream opened through `call_api`, its
    lines read and decoded as the adapter does (that part did not change)."""
    query = [("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", 300)]
    path = kube.CONFIGMAPS.path(NAMESPACE)
    # As the adapter's watch: no total deadline, only a silence limit.
    response = await call_api(api, "GET", path, query=query, limits=aiohttp.ClientTimeout(total=None, sock_read=60))
    try:
        async for event in kube._events(response, path):
            yield event
    finally:
        response.release()


# -- the two ways, block by block -------------------------------------------------------------------


async def blocks(ways: dict[str, Callable[[], Awaitable[int]]], n_blocks: int) -> dict[str, float]:
    """CPU µs per item of each way: each block's CPU over the items it handled, summed."""
    used: collections.Counter[str] = collections.Counter()
    items: collections.Counter[str] = collections.Counter()
    for _ in range(n_blocks):
        for name, way in ways.items():
            start = cpu()
            items[name] += await way()
            used[name] += cpu() - start
    return {name: used[name] * 1e6 / items[name] for name in ways}


async def requests(api: kube.Kube, n_blocks: int, block: int) -> dict[str, float]:
    """CPU µs per GET of the big ConfigMap and per POST of a small one, each way."""
    path = kube.CONFIGMAPS.path(NAMESPACE, BIG)
    serial = iter(range(10**9))

    def small() -> Any:
        return {"metadata": {"name": f"ws-client-cpu-{next(serial)}"}, "data": {"a": "b" * 300}}

    async def get_after() -> int:
        for _ in range(block):
            await api.get(kube.CONFIGMAPS, NAMESPACE, BIG)
        return block

    async def get_before() -> int:
        for _ in range(block):
            await request_before(api, "GET", path)
        return block

    async def post_after() -> int:
        for _ in range(block):
            await api.create(kube.CONFIGMAPS, NAMESPACE, small())
        return block

    async def post_before() -> int:
        for _ in range(block):
            await request_before(api, "POST", kube.CONFIGMAPS.path(NAMESPACE), small())
        return block

    await get_after()
    await get_before()  # both ways warm
    out = await blocks({"GET after": get_after, "GET before": get_before}, n_blocks)
    return out | await blocks({"POST after": post_after, "POST before": post_before}, n_blocks)


async def events(api: kube.Kube, n_blocks: int, block: int) -> dict[str, float]:
    """CPU µs per watch event of the big ConfigMap received, each way."""
    version = str((await api.list(kube.CONFIGMAPS, NAMESPACE))["metadata"]["resourceVersion"])

    async def take(stream: AsyncIterator[Any]) -> int:
        nonlocal version
        got = 0
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for event in stream:
                version = str(event["object"]["metadata"]["resourceVersion"])
                got += 1
                if got >= block:
                    break
        return got

    async def after() -> int:
        return await take(api.watch(kube.CONFIGMAPS, NAMESPACE, resource_version=version))

    async def before() -> int:
        return await take(watch_before(api, version))

    return await blocks({"watch event after": after, "watch event before": before}, n_blocks)


def counting_connections(counts: collections.Counter[str]) -> None:
    """Count the TLS connections aiohttp opens (a handshake each)."""
    create = aiohttp.TCPConnector._create_connection

    async def counted(self: aiohttp.TCPConnector, *args: Any, **kwargs: Any) -> Any:
        counts["connections opened"] += 1
        return await create(self, *args, **kwargs)

    aiohttp.TCPConnector._create_connection = counted  # type: ignore[method-assign]


async def run(n_blocks: int, block: int) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    counting_connections(counts)
    async with kubesim_process("fast") as cluster:
        admin_kubeconfig = str(Path(cluster.kubeconfig).with_name("admin.yaml"))
        await cluster.admin.create(kc.CONFIGMAPS, NAMESPACE, {"metadata": {"name": BIG}, "data": PAYLOAD})
        api = await kube.Kube.connect(KubernetesDriverConfig(kubeconfig=cluster.kubeconfig, namespace=NAMESPACE))
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, admin_kubeconfig, NAMESPACE, BIG, env={"PYTHONPATH": str(ROOT / "src")}
        )
        try:
            out = await requests(api, n_blocks, block)
            out |= await events(api, n_blocks, block)
        finally:
            writer.kill()
            await writer.wait()
            await api.aclose()
            await cluster.admin.aclose()
    requests_made = 2 * 2 * (n_blocks + 1) * block + 2 * n_blocks + 1
    return out | {"connections opened": counts["connections opened"], "requests and watches": requests_made}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=100)
    args = parser.parse_args()
    out = asyncio.run(run(args.blocks, args.block))
    print(json.dumps({k: round(v, 1) for k, v in out.items()}, ensure_ascii=False))


if __name__ == "__main__":
    main()
