"""The warm create path with a scripted API: one Match writes a SandboxClaim (settled by reading
back when the answer is lost), everything else goes cold with its reason, and without the
extension APIs warm pooling is off (creates cold as NotReady) with one warning (the gate's
transitions are in test_warm_gate)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from warmshell.core import matching
from warmshell.core.config import StatePaths
from warmshell.core.errors import AlreadyExistsError, UnavailableError
from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.core.ids import Fingerprint, SandboxId
from warmshell.core.models import Allocation, SandboxSpec
from warmshell.drivers.base import CreateRequest, MissReason
from warmshell.drivers.kubernetes import KubernetesDriver, kube
from warmshell.drivers.kubernetes.warm import claimactivation, poolcache

from . import crds
from .fakes import config
from .test_create import LOST

Obj = dict[str, Any]
IMAGE = "ghcr.io/warmshell/warmshell:0.1.0"
SHAPE = SandboxShape(workspace="default", image=IMAGE, environment={"FOO": "bar"})
REQUEST = CreateRequest(
    sandbox_id=SandboxId("sbx-1"),
    name="one",
    workspace="default",
    spec=SandboxSpec(environment={"FOO": "bar"}),
    activation_proof="p",
)


class Api:
    """Creates follow a script; reads return what was stored; lists answer empty (or 404)."""

    def __init__(self, creates: list[Any], *, extensions: bool = True) -> None:
        self.creates = creates
        self.extensions = extensions
        self.stored: dict[str, Obj] = {}
        self.calls: list[str] = []

    async def sandbox_resource(self, namespace: str) -> kube.Resource:
        return kube.sandboxes("v1beta1")

    async def list(self, resource: kube.Resource, namespace: str, **_: Any) -> Obj:
        if resource.group == kube.EXTENSIONS_GROUP and not self.extensions:
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    async def watch(self, resource: kube.Resource, namespace: str, **_: Any) -> AsyncGenerator[Obj, None]:
        await asyncio.Event().wait()  # the claim controller's watch: nothing happens on it
        yield {}

    async def create(self, resource: kube.Resource, namespace: str, body: Obj) -> Obj:
        self.calls.append(f"create {resource.kind}")
        step = self.creates.pop(0)
        if step in ("store", "store-then-lose"):
            self.stored[resource.plural] = body
        if step == "store":
            return body
        raise LOST if step == "store-then-lose" else step

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj:
        self.calls.append(f"get {resource.kind}")
        if resource.plural not in self.stored:
            raise kube.NotFound(404, "NotFound", name)
        return self.stored[resource.plural]


class Pools:
    """A synced pool cache holding the given pools (it follows nothing)."""

    def __init__(self, *pools: poolcache.CachedPool) -> None:
        self.pools = list(pools)
        self.index = matching.PoolIndex((p.fingerprint, p) for p in pools)

    @property
    def synced(self) -> bool:
        return self.index.synced

    def entries(self) -> list[poolcache.CachedPool]:
        return list(self.pools)

    def lookup(self, fp: Fingerprint) -> matching.MatchResult[poolcache.CachedPool]:
        return self.index.lookup(fp)

    def match(self, shape: SandboxShape) -> matching.MatchResult[poolcache.CachedPool]:
        return self.index.match(shape)

    def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class NoActivator(claimactivation.NotStarted):
    """Never asked to activate (no claim is bound here); registrations never change."""

    async def activate(self, **_: Any) -> None:
        raise AssertionError("creates never activate")


def pool(name: str = "foo", shape: SandboxShape = SHAPE) -> poolcache.CachedPool:
    return poolcache.CachedPool(name, shape.workspace, fingerprint(shape), shape, 2, 2)


async def create(api: Api, tmp_path: Path, pools: Pools) -> Any:
    driver = KubernetesDriver(config(), StatePaths(tmp_path), api=api, pool_cache=pools)  # type: ignore[arg-type]
    async with driver:
        await driver.start(NoActivator())
        return await driver.create(REQUEST)


async def test_a_single_match_writes_a_claim_for_that_pool(tmp_path: Path) -> None:
    api = Api(["store"])
    view = await create(api, tmp_path, Pools(pool()))
    assert view.allocation == Allocation.WARM
    assert view.pool == "foo"
    # Bound later by agent-sandbox: the claim controller reports that moment at activation.
    assert view.claimed_us == 0
    assert view.created_us > 0
    claim = api.stored["sandboxclaims"]
    crds.validator("SandboxClaim", "v1beta1").validate(claim)
    assert claim["spec"] == {"warmPoolRef": {"name": "foo"}}
    assert claim["metadata"]["labels"]["warmshell.dev/allocation"] == "sandbox-claim"
    assert claim["metadata"]["labels"]["warmshell.dev/sandbox-id"] == "sbx-1"
    assert claim["metadata"]["annotations"]["warmshell.dev/fingerprint"] == fingerprint(SHAPE)
    assert claim["metadata"]["annotations"]["warmshell.dev/activation-proof"] != "p"  # sealed, not the proof
    assert api.calls == ["create SandboxClaim"]


async def test_a_lost_claim_create_is_settled_by_reading_back(tmp_path: Path) -> None:
    api = Api(["store-then-lose"])
    view = await create(api, tmp_path, Pools(pool()))
    assert view.allocation == Allocation.WARM
    assert api.calls == ["create SandboxClaim", "get SandboxClaim"]  # never a second write, never cold


async def test_a_claim_create_that_stays_unknown_is_unavailable(tmp_path: Path) -> None:
    api = Api([LOST, LOST, LOST])

    async def flaky_get(*_: Any) -> Obj:
        raise LOST

    api.get = flaky_get  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="SandboxClaim"):
        await create(api, tmp_path, Pools(pool()))


async def test_a_claim_of_another_sandbox_under_the_name_is_refused(tmp_path: Path) -> None:
    api = Api([kube.AlreadyExists(409, "AlreadyExists", "exists")])
    api.stored["sandboxclaims"] = {
        "kind": "SandboxClaim",
        "metadata": {"labels": {"warmshell.dev/sandbox-id": "other"}},
    }
    with pytest.raises(AlreadyExistsError, match="another sandbox"):
        await create(api, tmp_path, Pools(pool()))


@pytest.mark.parametrize(
    ("pools", "reason"),
    [
        (Pools(), MissReason.NO_MATCH),
        (Pools(pool("one"), pool("two")), MissReason.AMBIGUOUS),
        (Pools(pool(shape=SandboxShape(workspace="other", image=IMAGE, environment={"FOO": "bar"}))), "NoMatch"),
    ],
)
async def test_everything_but_one_match_goes_cold_with_its_reason(tmp_path: Path, pools: Pools, reason: str) -> None:
    api = Api(["store"])
    view = await create(api, tmp_path, pools)
    assert view.allocation == Allocation.COLD
    assert view.miss_reason == reason
    assert api.calls == ["create Sandbox"]


async def test_an_unsynced_cache_goes_cold_as_not_ready(tmp_path: Path) -> None:
    api = Api(["store"])
    unsynced = Pools()
    unsynced.index = matching.PoolIndex()
    view = await create(api, tmp_path, unsynced)
    assert view.miss_reason == MissReason.NOT_READY


async def test_without_the_extension_apis_warm_pooling_is_off_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api = Api(["store"], extensions=False)
    driver = KubernetesDriver(config(), StatePaths(tmp_path), api=api)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        async with driver:
            await driver.start(NoActivator())
            view = await driver.create(REQUEST)
            assert driver.pools() == []
    assert view.miss_reason == MissReason.NOT_READY  # not configured off: it turns on when they appear
    warnings = [r for r in caplog.records if "extension APIs" in r.getMessage()]
    assert len(warnings) == 1
