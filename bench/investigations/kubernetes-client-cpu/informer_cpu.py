"""What the gateway's informers do with each watch event of a warm create, in CPU: the watch
events per create by resource and type, their size by top-level field, and the CPU of the
informers' callbacks (the caches, the views, the claim activation's wake-ups, the pool index)
per event and per create. The gateway runs in this process, as in
`../kubernetes-gateway-calls/calls.py` (whose run is reused: sequential warm creates, the pool
waited full after each):

    python bench/investigations/kubernetes-client-cpu/informer_cpu.py [--creates 20] [--pool 3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "kubernetes-gateway-calls")]

import calls  # noqa: E402

from warmshell.drivers.kubernetes import kube, watching  # noqa: E402

CPU: collections.Counter[str] = collections.Counter()
EVENTS: collections.Counter[str] = collections.Counter()
SIZES: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


def _timing_callbacks() -> None:
    """Every informer's `on_event` timed (thread CPU) by resource."""
    follow = watching.follow

    async def timed_follow(
        api: Any, resource: kube.Resource, namespace: str, *, on_event: Callable[[str, Any], None], **kwargs: Any
    ) -> Any:
        def timed(kind: str, obj: Any) -> None:
            start = time.thread_time()
            on_event(kind, obj)
            CPU[resource.plural] += time.thread_time() - start
            EVENTS[resource.plural] += 1

        return await follow(api, resource, namespace, on_event=timed, **kwargs)

    # informers, the pool cache and the claim informer all call `watching.follow` at run time.
    watching.follow = timed_follow  # type: ignore[assignment]


def _sizing_watches() -> None:
    """The JSON size of each event's object by top-level field (and metadata's, spec's)."""
    watch = kube.Kube.watch

    async def sized(self: kube.Kube, resource: kube.Resource, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for event in watch(self, resource, *args, **kwargs):
            obj = event.get("object") or {}
            sizes = SIZES[resource.plural]
            sizes["(events)"] += 1
            sizes["(whole)"] += len(orjson.dumps(obj))
            for key, value in obj.items():
                sizes[key] += len(orjson.dumps(value))
            yield event

    kube.Kube.watch = sized  # type: ignore[method-assign]


class _Clearing(collections.Counter[str]):
    """calls.py's counters: cleared after its warm-up create, and the ones here with them."""

    def clear(self) -> None:
        super().clear()
        for counter in (CPU, EVENTS, *SIZES.values()):
            counter.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--pool", type=int, default=3)
    args = parser.parse_args()
    _timing_callbacks()
    calls._counting_watches()
    _sizing_watches()
    calls._counting_watches = lambda: None  # counted above already, once
    calls.COUNTS = _Clearing()
    counts = asyncio.run(calls.run(args.creates, args.pool, False))
    print(f"per warm create ({args.creates} creates, pool {args.pool}):")
    for key, value in counts.items():
        if key.startswith("watch event"):
            print(f"  {key}: {value:.2f}")
    total = sum(EVENTS.values())
    for plural in sorted(EVENTS):
        n = EVENTS[plural]
        print(f"  {plural}: informer callbacks {CPU[plural] * 1e6 / n:.0f} µs per event")
    print(f"  all: {total / args.creates:.1f} events, {sum(CPU.values()) * 1e3 / args.creates:.2f} ms per create")
    for plural, sizes in sorted(SIZES.items()):
        n = max(sizes.pop("(events)"), 1)
        shown = ", ".join(f"{k} {v // n}" for k, v in sizes.most_common(5))
        print(f"  {plural} bytes per event: {shown}")


if __name__ == "__main__":
    main()
