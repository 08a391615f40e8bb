"""A gateway started while agent-sandbox's extension CRDs are absent: warm pooling is off with one
warning for the whole gateway (claim allocation and profiles share the driver's gate), creates go
cold; once the CRDs are installed it turns on by itself — a profile is reconciled and a matching
create goes warm — without a restart."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubesim.cluster import RunningCluster
from kubesim.controllers import client as kc
from kubesim.controllers import crds_install
from tests.helpers.gateway import wait_pools
from warmshell.api.v1 import sandbox_pb2 as pb
from warmshell.drivers.kubernetes import kube, labels
from warmshell.drivers.kubernetes.warm import extensions

from .conftest import NAMESPACE
from .test_profiles import absent, apply_profile, profile_gateway, ready_status, until
from .test_warm import apply_pool, wait_idle


def extension_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every warning (or worse) of the gateway that is about the extension APIs."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and (kube.EXTENSIONS_GROUP in r.getMessage() or "extension" in r.getMessage())
    ]


async def test_absent_extension_crds_warn_once_then_turn_on_when_installed(
    cluster: RunningCluster,
    admin: kc.KubeClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # kubesim installs every CRD at start; take the extension group's away, as on a cluster that
    # only has agent-sandbox's manifest.yaml. kubesim's own controllers retry their informers, so
    # they pick the CRDs up again when they return.
    extension_crds = [m for m in crds_install.manifests() if m["spec"]["group"] == kube.EXTENSIONS_GROUP]
    for crd in extension_crds:
        await admin.delete(crds_install.CRDS, None, crd["metadata"]["name"])
    await until(lambda: absent(admin))
    monkeypatch.setattr(extensions, "PROBE_DELAYS", (0.1,))  # the gateway's gate re-probes quickly
    caplog.set_level(logging.INFO)
    await apply_profile(admin, "wp-late", 'version = 1\nworkspace = "default"\nreplicas = 1\n')

    async with profile_gateway(cluster, tmp_path) as gw:
        await gw.create(name="early", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        early = await gw.wait_ready("early", timeout=30)
        assert early.status.phase == pb.SANDBOX_PHASE_READY
        assert early.status.allocation == "cold"
        assert {c.type: c for c in early.status.conditions}["Allocated"].message == "NotReady"
        # Many probes later (every 0.1 s while the create ran), by both the claim allocation and
        # the elected profile reconciler: still the one warning.
        assert len(extension_warnings(caplog)) == 1, extension_warnings(caplog)

        for crd in extension_crds:
            await admin.create(crds_install.CRDS, None, crd)
        status = await ready_status(admin, "wp-late")  # the profile reconciler came on too
        assert status[labels.PROFILE_GENERATED]
        await apply_pool(cluster, admin, tmp_path / "state", "late", 1)
        await wait_idle(gw, "late", 1)
        await gw.create(name="hot", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        hot = await gw.wait_ready("hot", timeout=30)
        assert hot.status.phase == pb.SANDBOX_PHASE_READY
        assert hot.status.allocation == "warm"
        claim = await admin.get(kc.CLAIMS, NAMESPACE, "default--hot")
        assert claim["spec"] == {"warmPoolRef": {"name": "late"}}
        code, out, _ = await gw.exec("hot", ["sh", "-c", "echo $FOO"])
        assert (code, out) == (0, b"bar\n")
    assert len(extension_warnings(caplog)) == 1, extension_warnings(caplog)
    assert any("warm pooling is on" in r.getMessage() for r in caplog.records)


async def test_crds_removed_while_running_turn_it_off_once_and_back_on(
    cluster: RunningCluster,
    admin: kc.KubeClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extensions, "PROBE_DELAYS", (0.1,))
    caplog.set_level(logging.INFO)
    extension_crds = [m for m in crds_install.manifests() if m["spec"]["group"] == kube.EXTENSIONS_GROUP]
    async with profile_gateway(cluster, tmp_path) as gw:
        await apply_pool(cluster, admin, tmp_path / "state", "before", 1)
        await wait_idle(gw, "before", 1)
        assert extension_warnings(caplog) == []

        for crd in extension_crds:
            await admin.delete(crds_install.CRDS, None, crd["metadata"]["name"])
        await until(lambda: absent(admin))
        # The gateway's next read of its claims (its reconciler lists every few hundred ms) gets
        # 404 on the collection: off, said once; creates go cold.
        await wait_pools(gw, lambda response: not response.pools)
        await gw.create(name="between", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        between = await gw.wait_ready("between", timeout=30)
        assert between.status.allocation == "cold"
        assert {c.type: c for c in between.status.conditions}["Allocated"].message == "NotReady"
        assert len(extension_warnings(caplog)) == 1, extension_warnings(caplog)

        for crd in extension_crds:
            await admin.create(crds_install.CRDS, None, crd)
        await apply_pool(cluster, admin, tmp_path / "state", "after", 1)
        await wait_idle(gw, "after", 1)
        await gw.create(name="hot", spec=pb.SandboxSpec(environment={"FOO": "bar"}))
        hot = await gw.wait_ready("hot", timeout=30)
        assert hot.status.allocation == "warm"
    assert len(extension_warnings(caplog)) == 1, extension_warnings(caplog)
