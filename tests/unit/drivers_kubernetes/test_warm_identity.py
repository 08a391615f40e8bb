"""Warm identity and claim activation against an in-process cluster: a pool member registers warm
pending, an adopted one is bound through its claim, and every spoofing attempt is refused before
a sandbox token is minted."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warmshell.api.v1 import supervisor_pb2 as spb
from warmshell.core.errors import PermissionDeniedError, WarmshellError
from warmshell.core.fingerprints import SandboxShape, fingerprint
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.core.models import SandboxRecord
from warmshell.drivers.base import Bound, WarmPending
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import kube, naming
from warmshell.drivers.kubernetes.identity import KubernetesIdentity
from warmshell.drivers.kubernetes.proofs import ProofSealer
from warmshell.drivers.kubernetes.rendering import SandboxIdentity
from warmshell.drivers.kubernetes.warm import claimactivation, claims, warmpools
from warmshell.gateway.activation import GatewayActivator
from warmshell.gateway.events import EventBus
from warmshell.gateway.records import SandboxRecords
from warmshell.gateway.registry import Registry
from warmshell.gateway.secretvault import SecretVault
from warmshell.gateway.store.sqlite import open_sqlite_store
from warmshell.gateway.tokens import SandboxTokenIssuer, hash_secret

from . import crds
from .fakes import KEY, NS, FakeCluster, claim_controller, config

Obj = dict[str, Any]
SHAPE = SandboxShape(workspace="default", image="ghcr.io/warmshell/warmshell:0.1.0", environment={"FOO": "bar"})


class WarmCluster(FakeCluster):
    """FakeCluster plus the pieces of a warm pool: template, pool, members, claims."""

    async def sandbox_resource(self, namespace: str) -> kube.Resource:
        return kube.sandboxes("v1beta1")

    def pool(self, name: str = "foo", shape: SandboxShape = SHAPE, **label_overrides: str) -> Obj:
        template, pool = warmpools.render_pool_pair(config(), name=name, namespace=NS, shape=shape, replicas=1)
        template["metadata"]["uid"] = f"uid-template-{name}"
        pool["metadata"]["uid"] = f"uid-pool-{name}"
        pool["metadata"]["labels"].update(label_overrides)
        self.put("sandboxtemplates", template)
        return self.put("sandboxwarmpools", pool)

    def member(self, pool: Obj, suffix: str = "abcde") -> tuple[Obj, Obj]:
        """A warm Sandbox as agent-sandbox fills it (copy of the template's blueprint), and its pod."""
        name = f"{pool['metadata']['name']}-{suffix}"
        template = self.objects[("sandboxtemplates", NS, pool["spec"]["sandboxTemplateRef"]["name"])]
        sandbox = {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-sandbox-{name}",
                "annotations": {"agents.x-k8s.io/pod-name": name},
                "ownerReferences": [_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool", pool)],
            },
            "spec": {"podTemplate": copy.deepcopy(template["spec"]["podTemplate"])},
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-pod-{name}",
                "labels": dict(sandbox["spec"]["podTemplate"]["metadata"]["labels"]),
                "ownerReferences": [_ref("agents.x-k8s.io/v1beta1", "Sandbox", sandbox)],
            },
            "spec": sandbox["spec"]["podTemplate"]["spec"],
        }
        return self.put("sandboxes", sandbox), self.put("pods", pod)

    def claim(
        self,
        *,
        sandbox_id: str = "sbx-1",
        name: str = "one",
        proof: str = "the-proof",
        pool: str = "foo",
        sealed: str | None = None,
        uid: str = "",
    ) -> Obj:
        ref = naming.object_ref(config(), "default", name)
        who = SandboxIdentity(
            sandbox_id=sandbox_id,
            workspace="default",
            name=name,
            sealed_proof=sealed
            if sealed is not None
            else ProofSealer(KEY).seal(proof, namespace=NS, name=ref.name, sandbox_id=sandbox_id),
        )
        claim = claims.render_claim(ref=ref, who=who, pool=pool, gateway_id="gw-test", fingerprint=fingerprint(SHAPE))
        claim["metadata"]["uid"] = uid or f"uid-claim-{ref.name}"
        return self.put("sandboxclaims", claim)

    def adopt(self, sandbox: Obj, claim: Obj) -> None:
        """agent-sandbox's adoption: the claim becomes the Sandbox's controller and names it."""
        sandbox["metadata"]["ownerReferences"] = [_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim)]
        claim["status"] = {"sandbox": {"name": sandbox["metadata"]["name"]}}


def _ref(api_version: str, kind: str, owner: Obj) -> Obj:
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


@pytest.fixture
def cluster() -> WarmCluster:
    return WarmCluster()


@pytest.fixture
def provider(cluster: WarmCluster) -> KubernetesIdentity:
    return KubernetesIdentity(cluster, config(), ProofSealer(KEY), Hub())


def test_the_claim_validates_and_names_only_its_pool(cluster: WarmCluster) -> None:
    claim = cluster.claim()
    crds.validator("SandboxClaim", "v1beta1").validate({k: v for k, v in claim.items()})
    assert claim["spec"] == {"warmPoolRef": {"name": "foo"}}  # no env: that would start it cold
    assert claims.is_ours(claim)
    assert claims.sandbox_id_of(claim) == "sbx-1"


async def test_a_pool_member_registers_warm_pending(cluster: WarmCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.member(cluster.pool())
    identity = await provider.authenticate(cluster.token_for(pod))
    assert identity is not None
    assert identity.binding == WarmPending(fingerprint(SHAPE))
    assert identity.workspace == "default"
    assert identity.instance_id == pod["metadata"]["uid"]


async def test_an_adopted_member_is_bound_through_its_claim(cluster: WarmCluster, provider: KubernetesIdentity) -> None:
    sandbox, pod = cluster.member(cluster.pool())
    cluster.adopt(sandbox, cluster.claim(proof="secret"))
    identity = await provider.authenticate(cluster.token_for(pod))
    assert identity is not None
    assert identity.binding == Bound(SandboxId("sbx-1"), "secret")
    target = await claimactivation.resolve_target(
        cluster, ProofSealer(KEY), cluster.objects[("sandboxclaims", NS, "default--one")]
    )  # type: ignore[arg-type]
    assert target is not None
    assert (target.pod_uid, target.sandbox_id, target.proof) == (pod["metadata"]["uid"], "sbx-1", "secret")


class Cache:
    """Cached Sandboxes and pods (as the driver's informers hold them)."""

    def __init__(self, sandboxes: list[Obj], pods: list[Obj]) -> None:
        self.sandboxes = {s["metadata"]["name"]: s for s in sandboxes}
        self.pods = {p["metadata"]["name"]: p for p in pods}

    def cached_sandbox(self, name: str) -> Obj | None:
        return self.sandboxes.get(name)

    def cached_pod(self, name: str) -> Obj | None:
        return self.pods.get(name)


async def test_a_claim_resolves_from_the_informers_cache_without_reading_the_cluster(cluster: WarmCluster) -> None:
    sandbox, pod = cluster.member(cluster.pool())
    cluster.adopt(sandbox, cluster.claim(proof="secret"))
    claim = cluster.objects[("sandboxclaims", NS, "default--one")]
    cluster.calls.clear()
    target = await claimactivation.resolve_target(
        cluster,  # type: ignore[arg-type]
        ProofSealer(KEY),
        claim,
        Cache([sandbox], [pod]),
    )
    assert target is not None
    assert (target.pod_uid, target.sandbox_id, target.proof) == (pod["metadata"]["uid"], "sbx-1", "secret")
    assert [c for c in cluster.calls if c[0] == "get"] == []


async def test_a_stale_or_missing_cache_entry_is_read_live(cluster: WarmCluster) -> None:
    sandbox, pod = cluster.member(cluster.pool())
    cluster.adopt(sandbox, cluster.claim(proof="secret"))
    claim = cluster.objects[("sandboxclaims", NS, "default--one")]
    stale = copy.deepcopy(pod)
    stale["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-earlier-sandbox"  # a pod of the same name, before
    for cache in (Cache([sandbox], [stale]), Cache([], [])):
        cluster.calls.clear()
        target = await claimactivation.resolve_target(cluster, ProofSealer(KEY), claim, cache)  # type: ignore[arg-type]
        assert target is not None
        assert target.pod_uid == pod["metadata"]["uid"]
        assert [c[0] for c in cluster.calls].count("get") == 2  # the Sandbox and the pod, live


async def test_a_cache_cannot_make_a_refused_chain_pass(cluster: WarmCluster) -> None:
    victim = cluster.claim(sandbox_id="victim", name="victim")
    sandbox, pod = cluster.member(cluster.pool())
    forged = cluster.claim(
        sandbox_id="victim", name="mine", sealed=victim["metadata"]["annotations"]["warmshell.dev/activation-proof"]
    )
    cluster.adopt(sandbox, forged)
    with pytest.raises(claimactivation.ClaimRefused):
        await claimactivation.resolve_target(
            cluster,  # type: ignore[arg-type]
            ProofSealer(KEY),
            forged,
            Cache([sandbox], [pod]),
        )


async def test_a_pool_that_has_not_opted_in_is_refused(cluster: WarmCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.member(cluster.pool(**{"warmshell.dev/warm-pool": "disabled"}))
    with pytest.raises(PermissionDeniedError, match="not opted in"):
        await provider.authenticate(cluster.token_for(pod))


# -- spoofing: each refused, no token minted ------------------------------------------------------


async def _no_activation(cluster: WarmCluster, claim: Obj) -> None:
    """The claim controller refuses the claim before calling the Activator."""
    with pytest.raises(claimactivation.ClaimRefused):
        await claimactivation.resolve_target(cluster, ProofSealer(KEY), claim)  # type: ignore[arg-type]


async def test_a_foreign_claim_with_our_labels_and_a_victims_id_is_refused(
    cluster: WarmCluster, provider: KubernetesIdentity
) -> None:
    victim = cluster.claim(sandbox_id="victim", name="victim")
    sandbox, pod = cluster.member(cluster.pool())
    # Someone else's claim: our labels, the victim's sandbox id, and the victim's sealed proof
    # copied over (it cannot seal its own without the key) — but sealed for another claim name.
    forged = cluster.claim(
        sandbox_id="victim", name="mine", sealed=victim["metadata"]["annotations"]["warmshell.dev/activation-proof"]
    )
    cluster.adopt(sandbox, forged)
    await _no_activation(cluster, forged)
    with pytest.raises(PermissionDeniedError, match="no valid activation proof"):
        await provider.authenticate(cluster.token_for(pod))
    # A proof sealed with another key is no better.
    other = cluster.claim(
        sandbox_id="victim",
        name="other",
        sealed=ProofSealer(b"k" * 32).seal("x", namespace=NS, name="default--other", sandbox_id="victim"),
    )
    await _no_activation(cluster, other)


async def test_a_claim_with_a_copied_proof_but_another_uid_is_refused(
    cluster: WarmCluster, provider: KubernetesIdentity
) -> None:
    sandbox, pod = cluster.member(cluster.pool())
    original = cluster.claim(proof="secret")
    cluster.adopt(sandbox, original)
    # The claim is replaced by one of the same name (so the sealed proof still opens), with a new uid.
    replacement = copy.deepcopy(original)
    replacement["metadata"]["uid"] = "uid-claim-impostor"
    cluster.put("sandboxclaims", replacement)
    await _no_activation(cluster, replacement)
    with pytest.raises(PermissionDeniedError, match="not a claim of ours"):
        await provider.authenticate(cluster.token_for(pod))


async def test_a_pod_not_controlled_by_the_claimed_sandbox_is_refused(cluster: WarmCluster) -> None:
    sandbox, pod = cluster.member(cluster.pool())
    claim = cluster.claim()
    cluster.adopt(sandbox, claim)
    other, _ = cluster.member(cluster.pool("bar"), suffix="zzzzz")
    pod["metadata"]["ownerReferences"] = [_ref("agents.x-k8s.io/v1beta1", "Sandbox", other)]
    await _no_activation(cluster, claim)


@pytest.fixture
async def records(tmp_path: Path) -> AsyncIterator[SandboxRecords]:
    store = await open_sqlite_store(tmp_path / "db.sqlite")
    yield SandboxRecords(store, EventBus())
    await store.aclose()


async def test_a_warm_pod_of_another_workspaces_pool_is_refused(
    cluster: WarmCluster, provider: KubernetesIdentity, records: SandboxRecords
) -> None:
    """The claim chain holds, but the pod came from a pool of workspace "other": the gateway's
    activator refuses it and the registration ends with an error instead of a token."""
    other_shape = SandboxShape(workspace="other", image=SHAPE.image, environment={"FOO": "bar"})
    _, pod = cluster.member(cluster.pool("theirs", shape=other_shape))
    identity = await provider.authenticate(cluster.token_for(pod))
    assert identity is not None
    assert identity.workspace == "other"
    registry: Registry[spb.SupervisorActivationMessage] = Registry()
    minted: list[str] = []
    issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="t", ttl_seconds=600)
    original_mint = issuer.mint

    def spy(*args: Any, **kwargs: Any) -> Any:
        minted.append("token")
        return original_mint(*args, **kwargs)

    issuer.mint = spy  # type: ignore[method-assign]
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await records.insert(
        SandboxRecord(id=SandboxId("sbx-1"), name="one", workspace="default", activation_proof_hash=hash_secret("p"))
    )
    registration = registry.register(identity)
    with pytest.raises(PermissionDeniedError, match="workspace"):
        await activator.activate(
            instance_id=InstanceId(pod["metadata"]["uid"]), sandbox_id=SandboxId("sbx-1"), proof="p", reason="t"
        )
    assert minted == []
    assert isinstance(await registration.next_outcome(), WarmshellError)


async def test_a_refused_claim_is_given_up_with_a_warning(
    cluster: WarmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller never calls the Activator for a refused claim, and says so once."""
    sandbox, pod = cluster.member(cluster.pool())
    claim = cluster.claim()
    cluster.adopt(sandbox, claim)
    pod["metadata"]["ownerReferences"] = []

    class Spy:
        calls: list[str] = []

        async def activate(self, **kwargs: Any) -> None:
            self.calls.append(kwargs["sandbox_id"])

        async def wait_registrations_changed(self, generation: int) -> int:
            await asyncio.Event().wait()  # registrations never change here
            return generation

    spy = Spy()
    controller = claim_controller(cluster, spy)
    with caplog.at_level(logging.WARNING):
        controller.replace([claim])  # what a listing of the claims hands it
        assert controller.in_flight == 1
        await controller.wait_in_flight()
    await controller.aclose()
    assert spy.calls == []
    assert any("given up" in r.getMessage() for r in caplog.records)


async def test_a_restarted_warm_pod_is_activated_again_for_the_same_sandbox(
    cluster: WarmCluster, provider: KubernetesIdentity, records: SandboxRecords
) -> None:
    """After activation the pod's supervisor restarts and registers again: bound through the same
    claim, it supersedes its tombstone and gets a fresh activation for the same sandbox."""
    sandbox, pod = cluster.member(cluster.pool())
    cluster.adopt(sandbox, cluster.claim(proof="p"))
    registry: Registry[spb.SupervisorActivationMessage] = Registry()
    issuer = SandboxTokenIssuer(Ed25519PrivateKey.generate(), gateway_id="t", ttl_seconds=600)
    activator = GatewayActivator(registry, records, issuer, SecretVault(records._store, bytes(32)))
    await records.insert(
        SandboxRecord(id=SandboxId("sbx-1"), name="one", workspace="default", activation_proof_hash=hash_secret("p"))
    )
    for _ in range(2):
        identity = await provider.authenticate(cluster.token_for(pod))
        assert identity is not None
        assert isinstance(identity.binding, Bound)
        registration = registry.register(identity)
        await activator.activate(
            instance_id=identity.instance_id, sandbox_id=identity.binding.sandbox_id, proof="p", reason="restart"
        )
        message = await registration.next_outcome()
        assert isinstance(message, spb.SupervisorActivationMessage)
        assert message.sandbox_id == "sbx-1"


async def test_claims_are_deduplicated_and_bounded_in_flight(
    cluster: WarmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Three bound claims, room for two: the third waits (logged at debug) and runs when a slot
    frees; a claim seen again after its activation is not activated twice."""

    pool = cluster.pool()
    claim_objs = []
    for i in range(3):
        sandbox, _ = cluster.member(pool, suffix=f"m{i}")
        claim = cluster.claim(sandbox_id=f"sbx-{i}", name=f"c{i}")
        cluster.adopt(sandbox, claim)
        claim_objs.append(claim)
    release, two, three = asyncio.Event(), asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    class Gate:
        async def activate(self, **kwargs: Any) -> None:
            calls.append(kwargs["sandbox_id"])
            (two if len(calls) == 2 else three if len(calls) == 3 else asyncio.Event()).set()
            await release.wait()

        async def wait_registrations_changed(self, generation: int) -> int:
            await asyncio.Event().wait()  # registrations never change here
            return generation

    controller = claim_controller(cluster, Gate(), max_in_flight=2)
    with caplog.at_level(logging.DEBUG, logger="warmshell.drivers.kubernetes.warm.claimactivation"):
        controller.replace(claim_objs)
        controller.replace(claim_objs)  # the same claims again (a resync): nothing new starts
        await two.wait()
        assert controller.in_flight == 2
        assert any("saturated" in r.getMessage() for r in caplog.records)
        release.set()
        await three.wait()
        await controller.wait_in_flight()
    assert sorted(calls) == ["sbx-0", "sbx-1", "sbx-2"]
    controller.replace(claim_objs)  # activated claims are done: no second activation
    assert controller.in_flight == 0
    await controller.aclose()


async def test_a_member_filled_from_an_older_template_is_refused(
    cluster: WarmCluster, provider: KubernetesIdentity
) -> None:
    """agent-sandbox keeps stale members (OnReplenish); one bound to a claim for the new shape
    must not run the new sandbox."""
    sandbox, pod = cluster.member(cluster.pool())
    (workload,) = [c for c in sandbox["spec"]["podTemplate"]["spec"]["containers"] if c["name"] == "workload"]
    workload["image"] = "ghcr.io/warmshell/warmshell:old"
    claim = cluster.claim()
    cluster.adopt(sandbox, claim)
    await _no_activation(cluster, claim)
    with pytest.raises(PermissionDeniedError, match="another shape"):
        await provider.authenticate(cluster.token_for(pod))
