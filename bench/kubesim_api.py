"""Benchmark the kubesim API server with kubernetes_asyncio as the client.

Starts ``kubesim serve --no-controllers`` as a subprocess (so client and server do not share an
event loop), installs the agent-sandbox CRDs, then measures on ``SandboxWarmPool`` custom objects:
create/get/patch/list latency (p50/p99), watch delivery latency (patch sent → MODIFIED event
received by an open watch, so it includes the write itself), and sustained creates per second with
concurrent clients. Results go to ``bench/results/kubesim_api.json`` and ``.md``.

    python bench/kubesim_api.py [--n 500] [--concurrency 32] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config, watch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CRD_DIRS = (
    ROOT / "src" / "kubesim" / "controllers" / "crds",
    ROOT.parent / "shared" / "reference" / "agent-sandbox-crds",
)
GROUP, VERSION, PLURAL = "extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools"
MERGE = "application/merge-patch+json"


def pool(name: str, ns: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench": "kubesim"}},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "tpl"}},
    }


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"n": len(ms), "p50_ms": round(q[49], 3), "p99_ms": round(q[98], 3), "max_ms": round(ms[-1], 3)}


async def timed(samples: list[float], coro: Any) -> Any:
    start = time.perf_counter()
    result = await coro
    samples.append(time.perf_counter() - start)
    return result


async def start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    kubeconfig = tmp / "kubeconfig"
    # The checkout's src/ first, so the benchmark measures this tree even without an install.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim.cli", "serve", "--no-controllers", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line:
            raise RuntimeError("kubesim serve exited before listening")
        if b"kubeconfig written" in line:
            return proc, kubeconfig
    raise RuntimeError("kubesim serve did not start within 30s")


async def install_crds(api: client.ApiClient) -> None:
    crd_dir = next(d for d in CRD_DIRS if len(list(d.glob("*.yaml"))) == 4)
    ext = client.ApiextensionsV1Api(api)
    for path in sorted(crd_dir.glob("*.yaml")):
        await ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))


async def single_object_verbs(co: client.CustomObjectsApi, n: int) -> dict[str, dict[str, float]]:
    ns = "default"
    create: list[float] = []
    get: list[float] = []
    patch: list[float] = []
    for i in range(n):
        await timed(create, co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pool(f"p{i}", ns)))
    for i in range(n):
        await timed(get, co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, f"p{i}"))
    for i in range(n):
        body = {"spec": {"replicas": 2}}
        await timed(
            patch, co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, f"p{i}", body, _content_type=MERGE)
        )
    return {"create": summary(create), "get": summary(get), "patch": summary(patch)}


async def list_verb(core: client.CoreV1Api, co: client.CustomObjectsApi, n: int, size: int) -> dict[str, float]:
    ns = "bench-list"
    await core.create_namespace({"metadata": {"name": ns}})
    for i in range(size):
        await co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pool(f"l{i}", ns))
    samples: list[float] = []
    for _ in range(n):
        out = await timed(samples, co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL))
        assert len(out["items"]) == size
    return {**summary(samples), "items": size}


async def watch_delivery(co: client.CustomObjectsApi, n: int) -> dict[str, float]:
    ns = "default"
    name = "watched"
    created = await co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pool(name, ns))
    arrivals: dict[int, float] = {}
    got = asyncio.Event()
    w = watch.Watch()

    async def consume() -> None:
        async with w.stream(
            co.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=created["metadata"]["resourceVersion"],
            timeout_seconds=600,
        ) as stream:
            async for event in stream:
                arrivals[event["object"]["spec"]["replicas"]] = time.perf_counter()
                got.set()

    task = asyncio.create_task(consume())
    samples: list[float] = []
    try:
        for i in range(n):
            replicas = 10 + i
            got.clear()
            sent = time.perf_counter()
            await co.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, {"spec": {"replicas": replicas}}, _content_type=MERGE
            )
            while replicas not in arrivals:
                await asyncio.wait_for(got.wait(), 10)
                got.clear()
            samples.append(arrivals[replicas] - sent)
    finally:
        w.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return summary(samples)


async def sustained_creates(
    api: client.ApiClient, core: client.CoreV1Api, concurrency: int, seconds: float
) -> dict[str, float]:
    ns = "bench-load"
    await core.create_namespace({"metadata": {"name": ns}})
    co = client.CustomObjectsApi(api)
    counter = 0
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker(wid: int) -> None:
        nonlocal counter, errors
        i = 0
        while time.perf_counter() < stop_at:
            try:
                await co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pool(f"w{wid}-{i}", ns))
                counter += 1
            except client.ApiException:
                errors += 1
            i += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {
        "creates": counter,
        "errors": errors,
        "seconds": round(elapsed, 3),
        "creates_per_second": round(counter / elapsed, 1),
        "concurrency": concurrency,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kubesim-bench-") as tmp:
        proc, kubeconfig = await start_server(Path(tmp))
        try:
            configuration = client.Configuration()
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
            configuration.connection_pool_maxsize = max(args.concurrency, 10)
            async with client.ApiClient(configuration) as api:
                await install_crds(api)
                co = client.CustomObjectsApi(api)
                core = client.CoreV1Api(api)
                # Warm up connections and code paths before measuring.
                await single_object_verbs_warmup(co)
                verbs = await single_object_verbs(co, args.n)
                verbs["list"] = await list_verb(core, co, args.n, args.list_size)
                delivery = await watch_delivery(co, args.n)
                load = await sustained_creates(api, core, args.concurrency, args.seconds)
        finally:
            proc.terminate()
            proc.wait(10)
    # Other work on the machine skews loopback latency; the load averages say how quiet it was.
    loadavg = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    return {"verbs": verbs, "watch_delivery": delivery, "sustained_creates": load, "loadavg_1_5_15": loadavg}


async def single_object_verbs_warmup(co: client.CustomObjectsApi) -> None:
    for i in range(50):
        await co.create_namespaced_custom_object(GROUP, VERSION, "kube-public", PLURAL, pool(f"warm{i}", "kube-public"))
        await co.get_namespaced_custom_object(GROUP, VERSION, "kube-public", PLURAL, f"warm{i}")


def write(results: dict[str, Any], command: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": command,
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "client": "kubernetes_asyncio " + __import__("kubernetes_asyncio").__version__,
        "object": f"{GROUP}/{VERSION} SandboxWarmPool (schema-validated custom resource)",
    }
    (RESULTS / "kubesim_api.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    v = results["verbs"]
    d = results["watch_delivery"]
    s = results["sustained_creates"]
    lines = [
        "# kubesim API server benchmark",
        "",
        f"Command: `{command}`  ",
        f"{meta['date']} · Python {meta['python']} · {meta['machine']} · {meta['client']}  ",
        f"Objects: {meta['object']}; server over HTTPS on loopback, in its own process.  ",
        f"Load average (1/5/15 min) before: {results['loadavg_1_5_15']['before']}, "
        f"after: {results['loadavg_1_5_15']['after']}.",
        "",
        "| measurement | n | p50 (ms) | p99 (ms) | max (ms) | target |",
        "|---|---|---|---|---|---|",
    ]
    for verb in ("create", "get", "patch"):
        r = v[verb]
        lines.append(f"| {verb} | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | p50 ≤ 2 ms |")
    r = v["list"]
    lines.append(f"| list ({r['items']} objects) | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | — |")
    lines.append(
        f"| watch delivery (patch sent → event received) | {d['n']} | {d['p50_ms']} | {d['p99_ms']} | "
        f"{d['max_ms']} | p50 ≤ 2 ms |"
    )
    lines += [
        "",
        f"Sustained creates: **{s['creates_per_second']}/s** ({s['creates']} creates, {s['errors']} errors, "
        f"{s['concurrency']} concurrent clients, {s['seconds']} s; target ≥ 1,000/s).",
        "",
    ]
    (RESULTS / "kubesim_api.md").write_text("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="samples per single-object verb")
    parser.add_argument("--list-size", type=int, default=100, help="objects returned by each list")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent clients for sustained creates")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of the sustained-create run")
    cli_args = parser.parse_args()
    out = asyncio.run(main(cli_args))
    cmd = "python bench/kubesim_api.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    write(out, cmd.strip())
    print((RESULTS / "kubesim_api.md").read_text())
