"""Count what one Kubernetes warm create costs the gateway in calls: every gRPC call it serves and
every message each carries (up and down, by method), every store write, and the API requests it
makes, per warm create. Each create is the bench's: CreateSandbox, a watch until Ready
(`--wait-ready`: CreateSandbox with `wait_ready`, one call, as the SDK sends), DeleteSandbox; the
replacement pod's registration and every periodic call in between are counted with it (the pool
is waited full again after each create, and counted too).

The gateway runs in this process (a counting interceptor on its servers, the store's writes
wrapped); kubesim in its own, its pods through the tests' pod shim:

    python bench/investigations/kubernetes-gateway-calls/calls.py [--creates 20] [--pool 3] [--wait-ready]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import kubernetes_warm  # noqa: E402

from tests.helpers.gateway import running_gateway  # noqa: E402
from tests.helpers.kubesim_process import kubesim_process  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import IMAGES, gateway_settings  # noqa: E402
from warmshell.api.v1 import sandbox_pb2 as pb  # noqa: E402
from warmshell.drivers.kubernetes import KubernetesDriver, kube  # noqa: E402
from warmshell.gateway import listening  # noqa: E402

WARM_ENV = kubernetes_warm.WARM_ENV
COUNTS: collections.Counter[str] = collections.Counter()


class Counting(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Counts calls and their messages by method."""

    async def intercept_service(self, continuation: Callable[..., Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        COUNTS[f"call {method}"] += 1
        return _wrapped(handler, method)


def _wrapped(handler: Any, method: str) -> Any:
    async def count_in(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            COUNTS[f"up {method}"] += 1
            yield request

    make = {
        (False, False): (grpc.unary_unary_rpc_method_handler, handler.unary_unary),
        (False, True): (grpc.unary_stream_rpc_method_handler, handler.unary_stream),
        (True, False): (grpc.stream_unary_rpc_method_handler, handler.stream_unary),
        (True, True): (grpc.stream_stream_rpc_method_handler, handler.stream_stream),
    }
    factory, behaviour = make[(handler.request_streaming, handler.response_streaming)]

    if handler.response_streaming:
        # grpc.aio iterates a handler's result only when the handler is an async generator function.
        async def run(request: Any, context: Any) -> Any:
            if handler.request_streaming:
                request = count_in(request)
            else:
                COUNTS[f"up {method}"] += 1
            async for reply in behaviour(request, context):
                COUNTS[f"down {method}"] += 1
                yield reply
    else:

        async def run(request: Any, context: Any) -> Any:  # type: ignore[misc]
            if handler.request_streaming:
                request = count_in(request)
            else:
                COUNTS[f"up {method}"] += 1
            reply = await behaviour(request, context)
            COUNTS[f"down {method}"] += 1
            return reply

    return factory(
        run, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _counting_servers() -> None:
    new_server = listening.new_server

    def counted(**kwargs: Any) -> grpc.aio.Server:
        kwargs["interceptors"] = (Counting(), *kwargs.get("interceptors", ()))
        return new_server(**kwargs)

    listening.new_server = counted  # type: ignore[assignment]


def _counting_watches() -> None:
    """Count the watch events the driver receives, by resource (bookmarks apart)."""
    watch = kube.Kube.watch

    async def counted(self: kube.Kube, resource: kube.Resource, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for event in watch(self, resource, *args, **kwargs):
            COUNTS[f"watch event {resource.plural} {event.get('type', '?')}"] += 1
            yield event

    kube.Kube.watch = counted  # type: ignore[method-assign]


def _count_writes(store: Any) -> None:
    for verb in ("create", "update", "delete"):
        original = getattr(store, verb)

        def wrap(original: Any, verb: str) -> Any:
            def counted(*args: Any, **kwargs: Any) -> Any:
                kind = kwargs.get("kind", args[0] if args else "?")
                COUNTS[f"store {verb} {kind}"] += 1
                if kind == "sandbox" and verb == "update":
                    COUNTS[f"store update sandbox by {_writer()}"] += 1
                return original(*args, **kwargs)

            return counted

        setattr(store, verb, wrap(original, verb))


def _writer() -> str:
    """The first function outside the records layer that asked for the write being sent."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.endswith(("records.py", "contextlib.py")):
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_qualname if frame is not None else "?"


async def run(creates: int, pool_size: int, wait_ready: bool) -> dict[str, float]:
    _counting_servers()
    _counting_watches()
    async with kubesim_process("fast", IMAGES) as cluster:
        with tempfile.TemporaryDirectory(prefix="ws-calls-") as tmp:
            state = Path(tmp) / "state"
            await kubernetes_warm.create_pool(cluster, state, pool_size)
            async with running_gateway(state, **gateway_settings(cluster, state)) as gw:
                driver = gw.gateway.parts.driver
                assert isinstance(driver, KubernetesDriver)
                _count_writes(gw.gateway.parts.store)
                await kubernetes_warm.wait_full(driver, pool_size)
                await _one(gw, "warmup", wait_ready)
                await kubernetes_warm.wait_full(driver, pool_size)
                COUNTS.clear()
                requests_before = await _requests(cluster)
                for i in range(creates):
                    await _one(gw, f"c{i}", wait_ready)
                    await kubernetes_warm.wait_full(driver, pool_size)
                requests = await _requests(cluster)
            await cluster.admin.delete(kubernetes_warm.kc.POOLS, kubernetes_warm.NAMESPACE, kubernetes_warm.POOL)
    for key, n in requests.items():
        if n - requests_before.get(key, 0):
            COUNTS[f"api {key}"] += n - requests_before.get(key, 0)
    return {k: v / creates for k, v in sorted(COUNTS.items())}


async def _one(gw: Any, name: str, wait_ready: bool) -> None:
    if wait_ready:
        got = await gw.stub.CreateSandbox(
            pb.CreateSandboxRequest(name=name, spec=pb.SandboxSpec(environment=WARM_ENV), wait_ready=True),
            metadata=gw.metadata,
        )
        assert got.status.phase == pb.SANDBOX_PHASE_READY, got
    else:
        await gw.create(name=name, spec=pb.SandboxSpec(environment=WARM_ENV))
        await gw.wait_ready(name, timeout=60)
    await gw.delete(name)


async def _requests(cluster: Any) -> dict[str, int]:
    return {f"{r['verb']} {r['resource']}": r["count"] for r in await cluster.counters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--pool", type=int, default=3)
    parser.add_argument("--wait-ready", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # the gateway's warnings, if any
    counts = asyncio.run(run(args.creates, args.pool, args.wait_ready))
    print(f"per warm create ({args.creates} creates, pool {args.pool}, wait_ready={args.wait_ready}):")
    for key, value in counts.items():
        print(f"  {key}: {value:.2f}")


if __name__ == "__main__":
    main()
