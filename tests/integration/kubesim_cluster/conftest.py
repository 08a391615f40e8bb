"""Fixtures: a whole kubesim cluster (API server + agent-sandbox controllers + kubelet), fast timing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kubesim.cluster import RunningCluster, running_cluster
from kubesim.controllers import client as kc


@pytest.fixture
async def cluster() -> AsyncIterator[RunningCluster]:
    async with running_cluster() as running:
        yield running


@pytest.fixture
async def api(cluster: RunningCluster) -> AsyncIterator[kc.KubeClient]:
    client = cluster.client()
    try:
        yield client
    finally:
        await client.aclose()
