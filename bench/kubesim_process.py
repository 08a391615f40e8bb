"""kubesim in a process of its own, for the Kubernetes benchmarks.

A real gateway never shares an event loop (or a GIL) with the API server, the agent-sandbox
controllers and the kubelet. Run in-process, every watch event, reconcile and pod start of the
simulator would be queued on the gateway's loop and counted as warmshell's latency; so the
benchmarks start `kubesim serve` as a child process and reach it, like the gateway does, over
HTTPS with a kubeconfig. Request counters come from kubesim's admin endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesim.controllers import client as kc
from tests.integration.drivers_kubernetes.conftest import IMAGES, NAMESPACE, SERVICE_ACCOUNT, delete_all_and_wait

# The kubeconfig user `kubesim serve` writes for the default (non-admin) user: the gateway's.
GATEWAY_USER = "kubesim-user"
_STARTUP_SECONDS = 60.0


@dataclass
class ClusterProcess:
    """A running `kubesim serve` with the benchmarks' namespace and ServiceAccount in place."""

    kubeconfig: str  # the default user's, for the gateway
    admin: kc.KubeClient

    async def counters(self, user: str = GATEWAY_USER) -> list[dict[str, Any]]:
        """kubesim's request counters of `user`: rows of user, verb, resource, count."""
        body = await self.admin.request("GET", "/_kubesim/requests", params={"user": user})
        return list(body["counters"])


@contextlib.asynccontextmanager
async def kubesim_process(timing: str = "fast") -> AsyncIterator[ClusterProcess]:
    """Start kubesim with the timing profile `timing` and the test image map; stop it (and so
    every pod process) on exit."""
    with tempfile.TemporaryDirectory(prefix="kubesim-bench-") as tmp:
        root = Path(tmp)
        image_map = root / "images.json"
        image_map.write_text(json.dumps(IMAGES))
        kubeconfig = root / "kubeconfig.yaml"
        env = os.environ | {"KUBESIM_TIMING": timing, "KUBESIM_IMAGE_MAP": str(image_map)}
        with (root / "kubesim.log").open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "kubesim.cli",
                "serve",
                "--kubeconfig",
                str(kubeconfig),
                "--admin-kubeconfig",
                str(root / "admin.yaml"),
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
            )
            try:
                await _wait_for_line(process, b"kubeconfig written", root / "kubesim.log")
                admin = kc.KubeClient.from_kubeconfig(str(root / "admin.yaml"))
                try:
                    await _wait_synced(admin)
                    cluster = ClusterProcess(str(kubeconfig), admin)
                    await _prepare(admin)
                    yield cluster
                    await delete_all_and_wait(admin, timeout=60)
                finally:
                    await admin.aclose()
            finally:
                if process.returncode is None:
                    process.terminate()
                    try:
                        await asyncio.wait_for(process.wait(), 30)
                    except TimeoutError:
                        process.kill()
                        await process.wait()


async def _wait_for_line(process: asyncio.subprocess.Process, marker: bytes, log: Path) -> None:
    assert process.stdout is not None
    async with asyncio.timeout(_STARTUP_SECONDS):
        while True:
            line = await process.stdout.readline()
            if not line:
                raise RuntimeError(f"kubesim exited before it was ready; see its log:\n{log.read_text()[-4000:]}")
            if marker in line:
                return


async def _wait_synced(admin: kc.KubeClient) -> None:
    """Until the controllers have installed the agent-sandbox CRDs (served collections)."""
    async with asyncio.timeout(_STARTUP_SECONDS):
        while True:
            with contextlib.suppress(kc.ApiError):
                await admin.request(
                    "GET", f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/sandboxclaims"
                )
                return
            await asyncio.sleep(0.1)


async def _prepare(admin: kc.KubeClient) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await admin.create(kc.NAMESPACES, "", namespace)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}}
    await admin.create(kc.SERVICEACCOUNTS, NAMESPACE, account)
