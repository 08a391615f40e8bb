"""CPU per write on kubesim's in-process path, the one its kubelet and controllers take: a pod's
status patched (the kubelet's most frequent write under warm creates) and a Sandbox's status
patched (the Sandbox controller's), each through the API server's one handler with four wire
watchers of the resource subscribed (the gateway's watches), with CPython's and with `kubesim
serve`'s collector thresholds.

    python bench/investigations/kubesim-api-cpu/write_path.py [--writes N] [--rounds R]

Run it once per tree (`PYTHONPATH=<an older tree's src>` for the other): it prints the CPU
(thread time, not wall) per write, the median of the rounds, so it reads the same on a loaded host.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from kubesim.apiserver import ApiServer, ServerConfig
from kubesim.apiserver.watch import Watcher
from kubesim.controllers import client as kc
from kubesim.controllers.crds_install import install_crds
from kubesim.inprocess import InProcessClient

CONTAINERS = ("supervisor", "agent")


def _pod() -> dict[str, Any]:
    container = {
        "image": "warmshell:dev",
        "command": ["warmshell", "supervisor"],
        "env": [{"name": f"E{i}", "value": "v" * 30} for i in range(12)],
        "volumeMounts": [{"name": f"v{i}", "mountPath": f"/m/{i}"} for i in range(5)],
        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    token = {"serviceAccountToken": {"path": "t", "expirationSeconds": 3600, "audience": "warmshell"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "default",
            "labels": {f"agents.x-k8s.io/l{i}": "v" * 20 for i in range(6)},
        },
        "spec": {
            "containers": [{"name": name, **container} for name in CONTAINERS],
            "volumes": [{"name": f"v{i}", "projected": {"sources": [token]}} for i in range(5)],
        },
    }


def _pod_status(i: int) -> dict[str, Any]:
    ready = "True" if i % 2 else "False"
    at = "2026-01-01T00:00:00Z"
    return {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": ready, "lastTransitionTime": at}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "127.0.0.1",
            "podIP": "10.0.0.1",
            "podIPs": [{"ip": "10.0.0.1"}],
            "startTime": at,
            "containerStatuses": [
                {
                    "name": name,
                    "ready": bool(i % 2),
                    "restartCount": 0,
                    "image": "warmshell:dev",
                    "imageID": "x",
                    "started": True,
                    "state": {"running": {"startedAt": at}},
                }
                for name in CONTAINERS
            ],
        }
    }


def _sandbox() -> dict[str, Any]:
    pod = _pod()
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"podTemplate": {"metadata": {"labels": {"app": "agent"}}, "spec": pod["spec"]}},
    }


def _sandbox_status(i: int) -> dict[str, Any]:
    ready = "True" if i % 2 else "False"
    conditions = [
        {
            "type": "Ready",
            "status": ready,
            "reason": "DependenciesReady",
            "message": f"Pod is Ready {i % 2}",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
        {
            "type": "Suspended",
            "status": "False",
            "reason": "NotSuspended",
            "message": "Sandbox is not suspended",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
    ]
    return {
        "status": {
            "conditions": conditions,
            "selector": "agents.x-k8s.io/sandbox-name-hash=abc",
            "podIPs": ["10.0.0.1"],
        }
    }


async def _round(writes: int, thresholds: tuple[int, int, int]) -> dict[str, float]:
    gc.set_threshold(*thresholds)
    server = ApiServer(ServerConfig())
    await server.start()
    try:
        api = InProcessClient(server, server.admin_token)
        await install_crds(api)
        await api.create(kc.PODS, "default", _pod())
        await api.create(kc.SANDBOXES, "default", _sandbox())
        for group, plural in (("", "pods"), ("agents.x-k8s.io", "sandboxes")):
            bucket = server.store.bucket(group, plural)
            for _ in range(4):
                bucket.subscribers.add(Watcher(namespace="default", predicate=None, api_version=None))
        cases = {
            "pod status patch": lambda i: api.patch(kc.PODS, "default", "p", _pod_status(i), sub="status"),
            "Sandbox status patch": lambda i: api.patch(kc.SANDBOXES, "default", "s", _sandbox_status(i), sub="status"),
        }
        out: dict[str, float] = {}
        for name, write in cases.items():
            for i in range(50):  # warm up
                await write(i)
            start = time.thread_time()
            for i in range(writes):
                await write(i)
                if i % 16 == 0:
                    for sub in server.store.subscribers():
                        if isinstance(sub, Watcher):
                            sub.lines.clear()
            out[name] = (time.thread_time() - start) / writes * 1e6
        return out
    finally:
        await server.stop()
        gc.set_threshold(700, 10, 10)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for label, thresholds in (
        ("CPython's collector", (700, 10, 10)),
        ("`kubesim serve`'s collector", (20_000, 10, 10)),
    ):
        rounds = [await _round(args.writes, thresholds) for _ in range(args.rounds)]
        for case in rounds[0]:
            print(f"{label}: {case}: {statistics.median(r[case] for r in rounds):.0f} us CPU per write")


if __name__ == "__main__":
    asyncio.run(main())
