"""kubesim in a process of its own: `kubesim serve` as a child process, reached like a cluster is,
over HTTPS with the kubeconfig it writes.

A real gateway never shares an event loop (or a GIL) with the API server, the agent-sandbox
controllers and the kubelet. Run in-process, every watch event, reconcile and pod start of the
simulator would be queued on the gateway's loop (and counted as warmshell's latency in a
benchmark); and the CLI end-to-end tests drive only real processes. `kubesim_serve` is the plain
synchronous form (the e2e tests); `kubesim_process` wraps it for the async benchmarks, with the
sandbox namespace and ServiceAccount created, an admin client and kubesim's request counters.

Stopping kubesim (SIGTERM) stops its kubelet, which kills every pod process it started.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubesim.controllers import client as kc
from tests.integration.drivers_kubernetes.conftest import IMAGES, NAMESPACE, SERVICE_ACCOUNT, delete_all_and_wait

__all__ = ["GATEWAY_USER", "ClusterProcess", "KubesimServe", "kubesim_process", "kubesim_serve"]

# The kubeconfig user `kubesim serve` writes for the default (non-admin) user: the gateway's.
GATEWAY_USER = "kubesim-user"
STARTUP_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
# A collection served only once the controllers have installed the agent-sandbox CRDs.
_SYNCED_PROBE = "/apis/extensions.agents.x-k8s.io/v1beta1/sandboxclaims"


@dataclass
class KubesimServe:
    """A running `kubesim serve`: API server, agent-sandbox controllers and kubelet."""

    process: subprocess.Popen[bytes]
    # The default user's kubeconfig (system:masters): what kubectl and the gateway use.
    kubeconfig: Path
    # The admin (controllers') token: kubesim's admin endpoints, such as request counters.
    admin_kubeconfig: Path
    log_path: Path

    def log(self) -> str:
        """Everything kubesim printed so far (for failure messages)."""
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def kubesim_serve(root: Path, timing: str = "fast", images: dict[str, Any] | None = None) -> Iterator[KubesimServe]:
    """`KUBESIM_TIMING=timing KUBESIM_IMAGE_MAP=<images, default the test image map> kubesim
    serve`, files under `root`; yields once the agent-sandbox CRDs are served, and stops kubesim
    (SIGTERM, so its kubelet kills every pod process) on exit."""
    root.mkdir(parents=True, exist_ok=True)
    image_map = root / "kubesim-images.json"
    image_map.write_text(json.dumps(IMAGES if images is None else images))
    kubeconfig, admin_kubeconfig, log_path = root / "kubeconfig.yaml", root / "admin.yaml", root / "kubesim.log"
    env = os.environ | {"KUBESIM_TIMING": timing, "KUBESIM_IMAGE_MAP": str(image_map)}
    argv = ["serve", "--kubeconfig", str(kubeconfig), "--admin-kubeconfig", str(admin_kubeconfig)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kubesim.cli", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    served = KubesimServe(process, kubeconfig, admin_kubeconfig, log_path)
    try:
        _wait_ready(served)
        yield served
    finally:
        _stop(served)


def _wait_ready(served: KubesimServe) -> None:
    """Until kubesim has written its kubeconfigs and its controllers have installed the CRDs."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    probe: tuple[urllib.request.Request, ssl.SSLContext] | None = None
    while True:
        if served.process.poll() is not None:
            raise AssertionError(f"kubesim exited with {served.process.returncode}; its log:\n{served.log()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"kubesim not ready in {STARTUP_TIMEOUT_SECONDS}s; its log:\n{served.log()[-4000:]}")
        if probe is None and "kubeconfig written" in served.log():
            probe = _request(served.admin_kubeconfig, _SYNCED_PROBE)
        if probe is not None:
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(probe[0], context=probe[1], timeout=5),
            ):
                return
        time.sleep(0.05)


def _request(kubeconfig: Path, path: str) -> tuple[urllib.request.Request, ssl.SSLContext]:
    """A GET of `path` with the kubeconfig's server, CA and bearer token (kubesim's kind)."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    headers = {"Authorization": f"Bearer {user['token']}", "Accept": "application/json"}
    return urllib.request.Request(cluster["server"] + path, headers=headers), tls


def _stop(served: KubesimServe) -> None:
    if served.process.poll() is None:
        served.process.terminate()
        try:
            served.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait()
            raise AssertionError(
                f"kubesim ignored SIGTERM for {STOP_TIMEOUT_SECONDS}s (pod processes may be left):\n{served.log()}"
            ) from None


# -- the benchmarks' async form --------------------------------------------------------------------


@dataclass
class ClusterProcess:
    """A running `kubesim serve` with the benchmarks' namespace and ServiceAccount in place."""

    kubeconfig: str  # the default user's, for the gateway
    admin: kc.KubeClient
    pid: int = 0  # the `kubesim serve` process (its pods' processes are its descendants)

    async def counters(self, user: str = GATEWAY_USER) -> list[dict[str, Any]]:
        """kubesim's request counters of `user`: rows of user, verb, resource, count."""
        body = await self.admin.request("GET", "/_kubesim/requests", params={"user": user})
        return list(body["counters"])


@contextlib.asynccontextmanager
async def kubesim_process(timing: str = "fast", images: dict[str, Any] | None = None) -> AsyncIterator[ClusterProcess]:
    """`kubesim_serve` with the timing profile `timing` (and `images`), the namespace and
    ServiceAccount created; on exit every Sandbox is deleted (and its pod gone) before kubesim
    stops.

    Starting and stopping kubesim block the event loop for a moment (a benchmark runs nothing
    else then)."""
    with (
        tempfile.TemporaryDirectory(prefix="kubesim-bench-") as tmp,
        kubesim_serve(Path(tmp), timing, images) as served,
    ):
        admin = kc.KubeClient.from_kubeconfig(str(served.admin_kubeconfig))
        try:
            await _prepare(admin)
            yield ClusterProcess(str(served.kubeconfig), admin, served.process.pid)
            await delete_all_and_wait(admin, timeout=60)
        finally:
            await admin.aclose()


async def _prepare(admin: kc.KubeClient) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await admin.create(kc.NAMESPACES, "", namespace)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}}
    await admin.create(kc.SERVICEACCOUNTS, NAMESPACE, account)
