"""The gateway under exactly the Helm chart's RBAC, on an RBAC-enforcing kubesim: every flow the
values enable works with the gateway ServiceAccount's own token, and a flow they disable fails
with the API server's 403 instead of silently."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config

from kubesim.apiserver import ServerConfig
from kubesim.cluster import RunningCluster, running_cluster
from tests.helpers.gateway import running_gateway, wait_pools
from tests.integration.drivers_kubernetes.conftest import IMAGES, NAMESPACE, delete_all_and_wait, gateway_settings
from tests.unit.chart.rendering import RELEASE_NAMESPACE, render
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.fingerprints import SandboxShape
from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.warm import warmpools

APPLIED = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Lease")


async def _api(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


async def _apply_chart(api: client.ApiClient, warm: bool) -> tuple[str, str]:
    """Apply the chart's identities and RBAC; return (gateway SA, sandbox SA) names."""
    manifests = render(
        {"warmPooling.enabled": warm, "warmPooling.profiles.enabled": False, "sandbox.namespace": NAMESPACE}
    )
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    await core.create_namespace({"metadata": {"name": RELEASE_NAMESPACE}})
    for kind in APPLIED:
        for obj in manifests.of_kind(kind):
            ns = obj["metadata"].get("namespace", "")
            if kind == "ServiceAccount":
                await core.create_namespaced_service_account(ns, obj)
            elif kind == "Role":
                await rbac.create_namespaced_role(ns, obj)
            elif kind == "RoleBinding":
                await rbac.create_namespaced_role_binding(ns, obj)
            elif kind == "ClusterRole":
                await rbac.create_cluster_role(obj)
            elif kind == "ClusterRoleBinding":
                await rbac.create_cluster_role_binding(obj)
            else:
                await client.CoordinationV1Api(api).create_namespaced_lease(ns, obj)
    gateway_sa = manifests.of_kind("ClusterRoleBinding")[0]["subjects"][0]["name"]
    sandbox_sa = next(
        sa["metadata"]["name"] for sa in manifests.of_kind("ServiceAccount") if sa["metadata"]["name"] != gateway_sa
    )
    return gateway_sa, sandbox_sa


async def _gateway_kubeconfig(api: client.ApiClient, cluster: RunningCluster, gateway_sa: str, path: Path) -> Path:
    token = await client.CoreV1Api(api).create_namespaced_service_account_token(
        gateway_sa, RELEASE_NAMESPACE, {"spec": {"expirationSeconds": 3600}}
    )
    data = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    data["users"][0]["user"] = {"token": token.status.token}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
async def rbac_cluster() -> AsyncIterator[RunningCluster]:
    async with running_cluster(image_map=IMAGES, config=ServerConfig(rbac=True)) as running:
        api = await _api(Path(running.kubeconfig))
        try:
            await client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        finally:
            await api.close()
        yield running
        admin = running.client()
        try:
            await delete_all_and_wait(admin)
        finally:
            await admin.aclose()


async def _apply_pool(api: client.ApiClient, settings: KubernetesDriverConfig, shape: SandboxShape) -> None:
    """Apply a pool as an operator would (kubectl's user), rendered for this gateway's settings."""
    template, pool = warmpools.render_pool_pair(
        settings,
        name="rbac-pool",
        namespace=NAMESPACE,
        shape=shape,
        replicas=1,
    )
    custom = client.CustomObjectsApi(api)
    group, version = "extensions.agents.x-k8s.io", "v1beta1"
    await custom.create_namespaced_custom_object(group, version, NAMESPACE, "sandboxtemplates", template)
    await custom.create_namespaced_custom_object(group, version, NAMESPACE, "sandboxwarmpools", pool)


IMAGES_IMAGE = "ghcr.io/warmshell/warmshell:test"


async def _run_gateway(cluster: RunningCluster, tmp_path: Path, warm: bool) -> Any:
    api = await _api(Path(cluster.kubeconfig))
    try:
        gateway_sa, sandbox_sa = await _apply_chart(api, warm)
        kubeconfig = await _gateway_kubeconfig(api, cluster, gateway_sa, tmp_path / "gateway.yaml")
    finally:
        await api.close()
    state = tmp_path / "state"
    settings = gateway_settings(cluster, state) | {
        "kubernetes.kubeconfig": str(kubeconfig),
        "kubernetes.service_account": sandbox_sa,
        "kubernetes.image": IMAGES_IMAGE,
        "kubernetes.warm_pooling": {"enabled": True},
    }
    return running_gateway(state, **settings)


async def test_every_enabled_flow_works_under_the_charts_rbac(rbac_cluster: RunningCluster, tmp_path: Path) -> None:
    async with await _run_gateway(rbac_cluster, tmp_path, warm=True) as gw:
        await gw.create(name="cold")
        ready = await gw.wait_ready("cold", timeout=30)
        assert ready.status.phase == pb.SANDBOX_PHASE_READY, ready
        code, out, _ = await gw.exec("cold", ["sh", "-c", "echo under-rbac"])
        assert (code, out) == (0, b"under-rbac\n")
        await gw.delete("cold")

        api = await _api(Path(rbac_cluster.kubeconfig))
        try:
            await _apply_pool(
                api,
                gw.gateway.config.kubernetes,
                SandboxShape(workspace="default", image=IMAGES_IMAGE, environment={"W": "1"}),
            )
        finally:
            await api.close()
        await wait_pools(gw, lambda r: any(p.name == "rbac-pool" and p.idle >= 1 for p in r.pools), timeout=30)
        await gw.create(name="warm", spec=pb.SandboxSpec(environment={"W": "1"}))
        warm = await gw.wait_ready("warm", timeout=30)
        assert warm.status.phase == pb.SANDBOX_PHASE_READY, warm
        assert warm.status.allocation == "warm"
        await gw.delete("warm")


async def test_a_flow_the_values_disable_fails_with_403(rbac_cluster: RunningCluster, tmp_path: Path) -> None:
    """Values without warm pooling grant no claim or pool access; a gateway configured for warm
    pooling anyway refuses to start with the API server's 403, naming what it could not do."""
    with pytest.raises(kube.Rejected) as refused:
        async with await _run_gateway(rbac_cluster, tmp_path, warm=False):
            pass
    assert refused.value.status == 403
    assert 'cannot list resource "sandboxwarmpools"' in str(refused.value)
