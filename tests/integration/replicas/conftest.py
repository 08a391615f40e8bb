"""Fixtures: kubesim (in this process), a real Postgres, and gateway replicas as processes of their
own behind a balancer (see tests/helpers/replicas.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from tests.helpers.postgres import DevPostgres
from tests.helpers.replicas import Balancer, ReplicaSet, balancer, replica_set
from tests.integration.drivers_kubernetes.conftest import admin, cluster, driver_config  # noqa: F401
from tests.integration.store.conftest import dev_postgres, own_postgres, postgres_url  # noqa: F401


@pytest.fixture
async def service() -> AsyncIterator[tuple[Balancer, list[ReplicaSet]]]:
    """The balancer, filled in with the replica set the test makes (the Service in front of it)."""
    holder: list[ReplicaSet] = []
    async with balancer(lambda: holder[0].backends() if holder else []) as running:
        yield running, holder


@pytest.fixture
async def replicas(
    cluster: RunningCluster,  # noqa: F811
    dev_postgres: DevPostgres,  # noqa: F811
    postgres_url: str,  # noqa: F811
    service: tuple[Balancer, list[ReplicaSet]],
    tmp_path: Path,
) -> AsyncIterator[ReplicaSet]:
    """Replicas (none started yet) on this test's database; sandbox pods reach them through the balancer."""
    front, holder = service
    driver = driver_config(cluster, tmp_path / "unused", gateway_address=front.address)
    async with replica_set(
        tmp_path / "replicas", store_url=postgres_url, password_file=dev_postgres.password_file, driver=driver
    ) as running:
        holder.append(running)
        yield running
