"""Several gateway replicas: allowed only with the external Postgres, and then rendered with what
replicas need (a PodDisruptionBudget, anti-affinity, a rolling update, the shared Secrets); the
secrets key (issue 16) is a chart-made Secret every replica mounts."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.unit.chart.rendering import Manifests, render, render_error
from tests.unit.chart.test_workload import (
    FULLNAME,
    config,
    gateway_container,
    mounts_by_path,
    pod_spec,
    volumes_by_name,
)
from warmshell.core.config import GatewayConfig
from warmshell.drivers import keyfiles
from warmshell.gateway.store import opening

POSTGRES = {"store.postgres.urlSecret": "warmshell-db", "gateway.replicas": 3}


def mounted_file(manifests: Manifests, path: str) -> tuple[str, str]:
    """(Secret name, key) of the Secret file mounted at `path` in the gateway container."""
    directory, name = path.rsplit("/", 1)
    mount = mounts_by_path(gateway_container(manifests))[directory]
    assert mount["readOnly"] is True
    secret = volumes_by_name(manifests)[mount["name"]]["secret"]
    (item,) = [i for i in secret["items"] if i["path"] == name]
    return secret["secretName"], item["key"]


def test_sqlite_stays_one_replica_with_a_recreate_strategy_and_no_budget() -> None:
    manifests = render()
    assert manifests.one("Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert manifests.of_kind("PodDisruptionBudget") == []
    assert "affinity" not in pod_spec(manifests)
    assert "store" not in config(manifests)
    assert "SQLite" in render_error({"gateway.replicas": 3})


def test_replicas_on_postgres_roll_one_at_a_time_spread_and_budgeted() -> None:
    manifests = render(POSTGRES)
    deployment = manifests.one("Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    budget = manifests.one("PodDisruptionBudget")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    (term,) = pod_spec(manifests)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    # Readiness is /healthz, which says NotServing while the store is unreachable (and while draining).
    assert gateway_container(manifests)["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # Liveness is not: a replica waiting for its database is kept out of the Service, not restarted.
    assert gateway_container(manifests)["livenessProbe"]["httpGet"]["path"] == "/livez"


def test_replicas_share_the_store_url_and_replica_token_from_secrets(tmp_path: Path) -> None:
    manifests = render(POSTGRES)
    settings = config(manifests)
    GatewayConfig.model_validate(settings)  # the gateway accepts what the chart renders
    assert mounted_file(manifests, settings["store"]["url_file"]) == ("warmshell-db", "url")
    name, key = mounted_file(manifests, settings["replicas"]["token_file"])
    assert (name, key) == (f"{FULLNAME}-replica-token", "replica-token")
    assert base64.b64decode(manifests.one("Secret", name)["data"][key])
    assert settings["replicas"]["drain_seconds"] == 10.0
    assert pod_spec(manifests)["terminationGracePeriodSeconds"] > settings["replicas"]["drain_seconds"] + 5
    # No PVC: replicas cannot share a ReadWriteOnce volume, and the state is in Postgres.
    assert manifests.of_kind("PersistentVolumeClaim") == []
    assert "emptyDir" in volumes_by_name(manifests)["state"]


async def test_the_url_is_read_from_the_mounted_file(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("postgresql://gw:s3cret@db:5432/warmshell\n")
    settings = GatewayConfig.model_validate({"store": {"url_file": str(url_file)}}).store
    assert await opening.read_url(settings) == "postgresql://gw:s3cret@db:5432/warmshell"
    url_file.write_text("mysql://nope\n")
    with pytest.raises(Exception, match=r"store.url_file.*postgresql://"):
        await opening.read_url(settings)


@pytest.mark.parametrize("values", [{}, POSTGRES])
def test_the_secrets_key_is_a_chart_made_secret_every_replica_mounts(values: dict[str, Any], tmp_path: Path) -> None:
    manifests = render(values)
    path = config(manifests)["secrets_key_file"]
    name, key = mounted_file(manifests, path)
    assert (name, key) == (f"{FULLNAME}-secrets-key", "secrets.key")
    content = base64.b64decode(manifests.one("Secret", name)["data"][key])
    target = tmp_path / "secrets.key"
    target.write_bytes(content)
    assert len(keyfiles.load_or_create_key(target)) == 32
    assert target.read_bytes() == content, "the gateway must read the mounted key, not replace it"


def test_brought_secrets_key_and_replica_token_are_used() -> None:
    manifests = render(POSTGRES | {"secretsKey.existingSecret": "sk", "replicaToken.existingSecret": "rt"})
    settings = config(manifests)
    assert mounted_file(manifests, settings["secrets_key_file"]) == ("sk", "secrets.key")
    assert mounted_file(manifests, settings["replicas"]["token_file"]) == ("rt", "replica-token")
    names = {s["metadata"]["name"] for s in manifests.of_kind("Secret")}
    assert not names & {f"{FULLNAME}-secrets-key", f"{FULLNAME}-replica-token"}


def test_a_drain_longer_than_the_grace_period_is_refused() -> None:
    error = render_error(POSTGRES | {"gateway.drainSeconds": 30})
    assert "terminationGracePeriodSeconds" in error
