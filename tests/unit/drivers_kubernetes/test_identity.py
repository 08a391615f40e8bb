"""The identity provider against an in-process cluster: the bound path and every refusal."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

import pytest

from warmshell.core.errors import PermissionDeniedError
from warmshell.core.ids import SandboxId
from warmshell.drivers.base import Bound
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import kube
from warmshell.drivers.kubernetes.identity import KubernetesIdentity, looks_like_jwt
from warmshell.drivers.kubernetes.proofs import ProofSealer

from .fakes import KEY, NS, FakeCluster, config


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def provider(cluster: FakeCluster) -> KubernetesIdentity:
    return KubernetesIdentity(cluster, config(), ProofSealer(KEY), Hub())


async def test_a_pod_of_our_sandbox_is_bound_with_its_proof(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    hub = Hub()
    events = hub.subscribe()
    provider = KubernetesIdentity(cluster, config(), ProofSealer(KEY), hub)
    _, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1", proof="secret-proof")
    identity = await provider.authenticate(cluster.token_for(pod))
    assert identity is not None
    assert identity.driver == "kubernetes"
    assert identity.instance_id == pod["metadata"]["uid"]
    assert identity.instance_name == "default--one"
    assert identity.workspace == "default"
    assert identity.binding == Bound(SandboxId("sbx-1"), "secret-proof")
    provider.registered(identity)
    event = await anext(events)  # the first: authenticating published nothing
    assert event.sandbox_id == "sbx-1"
    assert event.progress is not None
    assert (event.progress.reason, event.progress.message) == (
        "Registered",
        "the supervisor in pod default--one registered",
    )
    await events.aclose()
    # The review asked for our audience only.
    assert cluster.calls[0] == ("review", "warmshell-gateway")


async def test_the_identity_carries_the_pods_restart_count(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1", proof="secret-proof")
    first = await provider.authenticate(cluster.token_for(pod))
    assert first is not None
    assert first.incarnation == 0
    pod["status"] = {"containerStatuses": [{"name": "supervisor", "restartCount": 2}]}
    restarted = await provider.authenticate(cluster.token_for(pod))
    assert restarted is not None
    assert restarted.incarnation == 2


async def test_the_pod_is_read_while_the_review_runs_and_only_once(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1", proof="secret-proof")
    identity = await provider.authenticate(cluster.token_for(pod))
    assert identity is not None
    assert cluster.calls.count(("get", f"pods/{NS}/default--one")) == 1


async def test_the_pod_read_starts_before_the_review_answers(
    cluster: FakeCluster, provider: KubernetesIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round trip saved on every registration: the review only answers once the pod is read."""
    _, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1", proof="secret-proof")
    token = cluster.token_for(pod)
    pod_read = asyncio.Event()
    review, get = cluster.review_token, cluster.get

    async def review_after_the_read(token: str, audiences: Sequence[str]) -> dict[str, Any]:
        await asyncio.wait_for(pod_read.wait(), 2)
        return await review(token, audiences)

    async def get_noting_pods(resource: kube.Resource, namespace: str, name: str) -> dict[str, Any]:
        if resource.plural == "pods":
            pod_read.set()
        return await get(resource, namespace, name)

    monkeypatch.setattr(cluster, "review_token", review_after_the_read)
    monkeypatch.setattr(cluster, "get", get_noting_pods)
    identity = await provider.authenticate(token)
    assert identity is not None
    assert identity.binding == Bound(SandboxId("sbx-1"), "secret-proof")


async def test_a_payload_naming_another_pod_is_only_a_wrong_guess(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    """The payload is unverified: a token that names a victim's pod while the review binds it to
    the attacker's own is judged by the review's pod, and the guess is read and thrown away."""
    _, victim = cluster.sandbox_with_pod(sandbox_id="sbx-victim", proof="victim-proof", name="victim")
    _, own = cluster.sandbox_with_pod(sandbox_id="sbx-own", proof="own-proof", name="own")
    token = cluster.token_for(own, payload_pod=(NS, victim["metadata"]["name"]))
    identity = await provider.authenticate(token)
    assert identity is not None
    assert identity.binding == Bound(SandboxId("sbx-own"), "own-proof")
    assert identity.instance_id == own["metadata"]["uid"]


async def test_a_payload_outside_the_sandbox_namespaces_is_not_even_read(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1", proof="secret-proof")
    identity = await provider.authenticate(cluster.token_for(pod, payload_pod=("kube-system", "etcd")))
    assert identity is not None
    assert not [c for c in cluster.calls if "kube-system" in c[1]]


@pytest.mark.parametrize("credential", ["", "wsl1.abc.def", "not-a-token", "a.b", "x.y.z", "a..c"])
async def test_credentials_that_are_not_jwts_fall_through(provider: KubernetesIdentity, credential: str) -> None:
    assert not looks_like_jwt(credential)
    assert await provider.authenticate(credential) is None


async def _refused(provider: KubernetesIdentity, token: str, fragment: str) -> None:
    with pytest.raises(PermissionDeniedError, match=fragment):
        await provider.authenticate(token)


async def test_an_unknown_token_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    from .fakes import jwt_like

    await _refused(provider, jwt_like("forged"), "not authenticated")


async def test_a_token_for_another_audience_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    token = cluster.token_for(pod, audiences=["https://kubernetes.default.svc"])
    await _refused(provider, token, "not authenticated")


async def test_a_review_that_omits_our_audience_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    token = cluster.token_for(pod)

    async def review(token: str, audiences: object) -> dict[str, object]:
        status = dict(cluster.reviews[token])
        status.pop("_token_audiences")
        return {**status, "audiences": ["https://kubernetes.default.svc"]}

    cluster.review_token = review  # type: ignore[method-assign]
    await _refused(provider, token, "audience")


async def test_a_token_of_another_service_account_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod()
    await _refused(provider, cluster.token_for(pod, service_account="default"), "not the sandbox ServiceAccount")


async def test_a_token_from_another_namespace_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    await _refused(provider, cluster.token_for(pod, namespace="attacker"), "not a sandbox namespace")


async def test_a_user_that_is_not_a_service_account_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod()
    token = cluster.token_for(pod)
    cluster.reviews[token]["user"]["username"] = "alice"
    await _refused(provider, token, "not a ServiceAccount")


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"authentication.kubernetes.io/pod-name": ["default--one"]},
        {"authentication.kubernetes.io/pod-name": ["a", "b"], "authentication.kubernetes.io/pod-uid": ["u"]},
        {"authentication.kubernetes.io/pod-name": [""], "authentication.kubernetes.io/pod-uid": ["u"]},
        {"authentication.kubernetes.io/pod-name": "default--one", "authentication.kubernetes.io/pod-uid": "u"},
    ],
)
async def test_a_token_not_bound_to_exactly_one_pod_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity, extra: dict[str, object]
) -> None:
    _, pod = cluster.sandbox_with_pod()
    await _refused(provider, cluster.token_for(pod, extra=extra), "exactly one pod")


async def test_a_token_bound_to_a_deleted_pod_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    token = cluster.token_for(pod)
    del cluster.objects[("pods", NS, pod["metadata"]["name"])]
    await _refused(provider, token, "no longer exists")


async def test_a_token_of_a_pod_replaced_under_the_same_name_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod()
    token = cluster.token_for(pod)
    pod["metadata"]["uid"] = "uid-of-a-new-pod"
    await _refused(provider, token, "replaced")


async def test_a_terminating_pod_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await _refused(provider, cluster.token_for(pod), "being deleted")


async def test_a_pod_with_two_controllers_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    second = copy.deepcopy(pod["metadata"]["ownerReferences"][0]) | {"name": "other", "uid": "uid-other"}
    pod["metadata"]["ownerReferences"].append(second)
    await _refused(provider, cluster.token_for(pod), "2 controllers")


async def test_a_pod_without_a_controller_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    pod["metadata"]["ownerReferences"][0]["controller"] = False
    await _refused(provider, cluster.token_for(pod), "0 controllers")


async def test_a_pod_controlled_by_something_else_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod()
    pod["metadata"]["ownerReferences"][0].update(apiVersion="apps/v1", kind="ReplicaSet")
    await _refused(provider, cluster.token_for(pod), "not an agent-sandbox Sandbox")


async def test_an_owner_with_a_different_uid_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    sandbox, pod = cluster.sandbox_with_pod()
    sandbox["metadata"]["uid"] = "uid-of-a-recreated-sandbox"
    await _refused(provider, cluster.token_for(pod), "uid differs")


async def test_a_pod_whose_sandbox_is_gone_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    sandbox, pod = cluster.sandbox_with_pod()
    del cluster.objects[("sandboxes", NS, sandbox["metadata"]["name"])]
    await _refused(provider, cluster.token_for(pod), "Sandbox is gone")


async def test_a_sandbox_not_managed_by_warmshell_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    sandbox, pod = cluster.sandbox_with_pod()
    del sandbox["metadata"]["labels"]["warmshell.dev/managed-by"]
    await _refused(provider, cluster.token_for(pod), "not managed by warmshell")


async def test_a_mismatched_sandbox_id_label_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    sandbox, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1")
    sandbox["metadata"]["labels"]["warmshell.dev/sandbox-id"] = "sbx-victim"
    await _refused(provider, cluster.token_for(pod), "does not match")


async def test_a_mismatched_sandbox_id_annotation_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    _, pod = cluster.sandbox_with_pod(sandbox_id="sbx-1")
    pod["metadata"]["annotations"]["warmshell.dev/sandbox-id"] = "sbx-victim"
    await _refused(provider, cluster.token_for(pod), "does not match")


async def test_a_pod_without_a_sandbox_id_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    _, pod = cluster.sandbox_with_pod()
    del pod["metadata"]["annotations"]["warmshell.dev/sandbox-id"]
    await _refused(provider, cluster.token_for(pod), "does not match")


async def test_a_victims_sandbox_id_without_its_proof_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    # Someone who may create Sandboxes labels one with a victim's id but cannot seal the proof.
    _sandbox, pod = cluster.sandbox_with_pod(sandbox_id="sbx-victim", sealer=ProofSealer(bytes(32)))
    await _refused(provider, cluster.token_for(pod), "no valid activation proof")


async def test_a_proof_copied_from_another_sandbox_is_refused(
    cluster: FakeCluster, provider: KubernetesIdentity
) -> None:
    victim, _ = cluster.sandbox_with_pod(sandbox_id="sbx-victim", name="victim")
    attacker, pod = cluster.sandbox_with_pod(sandbox_id="sbx-victim", name="attacker")
    attacker["metadata"]["annotations"]["warmshell.dev/activation-proof"] = victim["metadata"]["annotations"][
        "warmshell.dev/activation-proof"
    ]
    await _refused(provider, cluster.token_for(pod), "no valid activation proof")


async def test_a_sandbox_without_a_proof_is_refused(cluster: FakeCluster, provider: KubernetesIdentity) -> None:
    sandbox, pod = cluster.sandbox_with_pod()
    del sandbox["metadata"]["annotations"]["warmshell.dev/activation-proof"]
    await _refused(provider, cluster.token_for(pod), "no valid activation proof")


async def test_refusals_never_log_the_token(
    cluster: FakeCluster, provider: KubernetesIdentity, caplog: pytest.LogCaptureFixture
) -> None:
    _, pod = cluster.sandbox_with_pod()
    token = cluster.token_for(pod, service_account="default")
    with pytest.raises(PermissionDeniedError) as refused:
        await provider.authenticate(token)
    assert token not in caplog.text
    assert token not in str(refused.value)
    assert any("refused" in r.message for r in caplog.records)
