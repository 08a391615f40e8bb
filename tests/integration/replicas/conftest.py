"""Fixtures: kubesim (in this process), a real Postgres, and gateway replicas as processes of their
own behind a balancer (see tests/helpers/replicas.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from tests.helpers.postgres import DevPostgres, dev_postgres_server
from tests.helpers.replicas import Balancer, ReplicaSet, balancer, replica_set
from tests.integration.drivers_kubernetes.conftest import admin, cluster, driver_config  # noqa: F401


@pytest.fixture(scope="session")
def dev_postgres() -> Iterator[DevPostgres]:
    with dev_postgres_server() as server:
        yield server


@pytest.fixture
async def postgres_url(dev_postgres: DevPostgres) -> AsyncIterator[str]:
    url = await dev_postgres.create_database()
    try:
        yield url
    finally:
        await dev_postgres.drop_database(url)


@pytest.fixture
async def service() -> AsyncIterator[tuple[Balancer, list[ReplicaSet]]]:
    """The balancer, filled in with the replica set the test makes (the Service in front of it)."""
    holder: list[ReplicaSet] = []
    async with balancer(lambda: holder[0].backends() if holder else []) as running:
        yield running, holder


@pytest.fixture
async def replicas(
    cluster: RunningCluster,  # noqa: F811
    dev_postgres: DevPostgres,
    postgres_url: str,
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


@pytest.fixture
def own_postgres() -> Iterator[DevPostgres]:
    """A server of this test's own, to restart under the replicas."""
    with dev_postgres_server() as server:
        yield server
