"""Issue 6 benchmark: cold create -> Ready on the Kubernetes driver against kubesim with zero
simulated delays (the `FAST` timing profile), so what is measured is warmshell's own overhead plus
kubesim's API round trips, next to the time the pod itself takes to start.

kubesim (API server, agent-sandbox controllers, kubelet) runs in a process of its own
(`tests/helpers/kubesim_process.py`), so its work is not queued on the gateway's event loop; the
gateway with the Kubernetes driver runs in this process. Pods run the real supervisor through the
test pod shim (bubblewrap). Per create, from the sandbox's timeline and a timer around the
identity check:

- create: requested -> backend created (persist, render, seal, one API create);
- identity: the driver's authenticate() (TokenReview, GET pod, GET Sandbox, open the proof);
- activate -> Ready: registered -> ready (activation, token mint, the supervisor's session);
- pod start: backend created -> registered, minus identity (agent-sandbox makes the pod, the
  kubelet starts the process, Python starts the supervisor — not warmshell's overhead).

warmshell's own overhead = create + identity + activate -> Ready. API requests per create come
from kubesim's request counters for the gateway's user (watches excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import summary, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.gateway import running_gateway  # noqa: E402
from tests.helpers.kubesim_process import ClusterProcess, kubesim_process  # noqa: E402
from tests.integration.drivers_kubernetes.conftest import gateway_settings  # noqa: E402

WRITES = ("create", "update", "patch", "delete")
REVIEWS = "tokenreviews.authentication.k8s.io"


async def counts(cluster: ClusterProcess) -> tuple[int, int]:
    """(requests, writes) of the gateway's user so far; watches and TokenReviews apart."""
    requests = writes = 0
    for row in await cluster.counters():
        verb, n = row["verb"], row["count"]
        if verb == "watch":
            continue
        requests += n
        writes += n if verb in WRITES and row["resource"] != REVIEWS else 0
    return requests, writes


async def measure(creates: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {k: [] for k in ("total", "create", "identity", "activate", "pod", "own")}
    per_create_requests: list[int] = []
    per_create_writes: list[int] = []
    async with kubesim_process() as cluster:
        with tempfile.TemporaryDirectory(prefix="ws-k8s-bench-") as tmp:
            state = Path(tmp) / "state"
            # The default relist interval, so periodic relists do not count as per-create requests.
            settings = gateway_settings(cluster, state) | {"reconcile_interval_seconds": 10.0}
            async with running_gateway(state, **settings) as gw:
                identity_ms: list[float] = []
                provider = gw.gateway.parts.driver.identity
                authenticate = provider.authenticate

                async def timed(credential: str) -> Any:
                    start = time.perf_counter()
                    try:
                        return await authenticate(credential)
                    finally:
                        identity_ms.append((time.perf_counter() - start) * 1000)

                provider.authenticate = timed  # type: ignore[method-assign]
                for i in range(creates + 3):
                    name = f"cold-{i}"
                    before = await counts(cluster)
                    ready = await gw.create(name=name)
                    ready = await gw.wait_ready(name, timeout=60)
                    after = await counts(cluster)
                    t = ready.status.timeline
                    if i < 3:  # warm-up: first connections, imports, the Sandbox API probe
                        await gw.delete(name)
                        continue
                    ident = identity_ms[-1]
                    create_ms = (t.backend_created_us - t.requested_us) / 1000
                    activate_ms = (t.ready_us - t.registered_us) / 1000
                    samples["total"].append((t.ready_us - t.requested_us) / 1000)
                    samples["create"].append(create_ms)
                    samples["identity"].append(ident)
                    samples["activate"].append(activate_ms)
                    samples["pod"].append((t.registered_us - t.backend_created_us) / 1000 - ident)
                    samples["own"].append(create_ms + ident + activate_ms)
                    per_create_requests.append(after[0] - before[0])
                    per_create_writes.append(after[1] - before[1])
                    await gw.delete(name)
    return {
        "creates": creates,
        "ms": {k: summary(v) for k, v in samples.items()},
        "api_requests_per_create": summary([float(n) for n in per_create_requests]),
        "api_writes_per_create": summary([float(n) for n in per_create_writes]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=100)
    args = parser.parse_args()
    data = asyncio.run(measure(args.creates))
    ms = data["ms"]
    writes = data["api_writes_per_create"]
    data["targets"] = {"own_overhead_p50_le_20ms": ms["own"]["p50"] <= 20, "writes_per_create_le_6": writes["max"] <= 6}
    labels = [
        ("total", "cold create -> Ready (timeline: requested -> ready)"),
        ("create", "  create: persist, render, seal, API create"),
        ("pod", "  pod start: agent-sandbox + kubelet + Python + supervisor start (not warmshell)"),
        ("identity", "  identity: TokenReview + GET pod + GET Sandbox + open proof"),
        ("activate", "  activation -> session -> Ready"),
        ("own", "warmshell's own overhead (create + identity + activate)"),
    ]
    table = "| measurement | n | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|---|\n"
    for key, label in labels:
        s = ms[key]
        table += f"| {label} | {s['n']} | {s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f} |\n"
    requests = data["api_requests_per_create"]
    table += (
        f"\nAPI requests per cold create (gateway user, watches excluded): p50 {requests['p50']:.0f}, "
        f"max {requests['max']:.0f}; writes (TokenReview excluded): max {writes['max']:.0f} (target <= 6). "
        f"warmshell's own overhead p50 **{ms['own']['p50']:.2f} ms** (target <= 20 ms).\n"
    )
    write_results("kubernetes_cold", data, table)
    print(table)


if __name__ == "__main__":
    main()
