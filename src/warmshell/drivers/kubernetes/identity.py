"""Who is this supervisor? The Kubernetes answer, from the pod's projected ServiceAccount token.

Fail-closed and in this order (each step trusts only what the previous ones established):
1. TokenReview for our audience: authenticated, the audience granted, the username
   `system:serviceaccount:<ns>:<sa>` with `<ns>` accepted by the namespace mode and `<sa>` the
   configured sandbox ServiceAccount;
2. exactly one pod name and one pod uid in the review's `extra` (the token is bound to a pod);
3. the live pod has that uid (a token of a deleted pod whose name was reused is refused); the pod
   is read while the review runs, by the name the token's payload states, and that read counts
   only if the review then names the same pod;
4. the pod's single controlling ownerReference is an agent-sandbox Sandbox, and the live Sandbox
   of that name has that uid;
5. the Sandbox is ours and its sandbox-id label equals the pod's sandbox-id annotation;
6. the activation proof sealed on the Sandbox opens for (namespace, name, sandbox id).
Then the supervisor is bound to that sandbox. A Sandbox with a controller takes one of two warm
branches instead of 5-6: controlled by a live opted-in `SandboxWarmPool` (same uid), it is *warm
pending* with the fingerprint of the shape its own pod template runs; controlled by a live claim
of ours (same uid) whose sealed proof opens for (namespace, claim name, sandbox id), it is bound
to that sandbox (how a warm pod that registers after adoption, or re-registers after a restart,
is activated). The identity carries the pod's container restart count as its incarnation, which
only the kubelet raises: the gateway re-activates a later incarnation (a restarted supervisor),
not a replay of the pod's token by its workload. The gateway needs no permission to patch pods, so a
pod's annotations are what the Sandbox's pod template said at create. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.errors import PermissionDeniedError
from warmshell.core.fingerprints import fingerprint
from warmshell.core.ids import InstanceId, SandboxId
from warmshell.drivers.base import Bound, DriverEvent, ProgressLine, SupervisorIdentity, WarmPending
from warmshell.drivers.events import Hub
from warmshell.drivers.kubernetes import kube, labels, naming
from warmshell.drivers.kubernetes.proofs import ProofSealer
from warmshell.drivers.kubernetes.warm import claims, warmpools

__all__ = ["IdentityApi", "KubernetesIdentity", "looks_like_jwt"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"


class IdentityApi(Protocol):
    """What the provider reads from the cluster (`kube.Kube`, or an in-process fake in tests)."""

    async def review_token(self, token: str, audiences: Sequence[str]) -> Obj: ...

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj: ...


class KubernetesIdentity:
    """An `IdentityProvider` for supervisors in agent-sandbox pods."""

    def __init__(self, api: IdentityApi, config: KubernetesDriverConfig, sealer: ProofSealer, hub: Hub) -> None:
        self._api = api
        self._config = config
        self._sealer = sealer
        self._hub = hub  # the driver's event hub, for the "Registered" progress line

    async def authenticate(self, credential: str) -> SupervisorIdentity | None:
        """The identity behind a pod's token; None when the credential is not a JWT at all.
        Reads the cluster, changes nothing."""
        if not looks_like_jwt(credential):
            return None
        try:
            return await self._resolve(credential)
        except PermissionDeniedError as exc:
            log.warning("supervisor credential refused: %s", exc)
            raise

    def registered(self, identity: SupervisorIdentity) -> None:
        """A registration of this pod was accepted: a bound pod shows a progress line. (A warm
        pending one is counted idle from the gateway's registrations: see `Activator.idle_members`.)"""
        if isinstance(identity.binding, Bound):
            line = ProgressLine("Registered", f"the supervisor in pod {identity.instance_name} registered")
            self._hub.publish(DriverEvent(identity.binding.sandbox_id, progress=line))

    async def _resolve(self, token: str) -> SupervisorIdentity:
        namespace, pod_name, pod_uid, pod = await self._review_and_read_pod(token)
        if _meta(pod).get("uid") != pod_uid:
            raise PermissionDeniedError(f"pod {namespace}/{pod_name} was replaced since the token was issued")
        if _meta(pod).get("deletionTimestamp"):
            raise PermissionDeniedError(f"pod {namespace}/{pod_name} is being deleted")
        owner = _controller(pod)
        sandbox = await self._live(
            kube.sandboxes(owner["apiVersion"].split("/", 1)[1]), namespace, owner["name"], "the pod's Sandbox is gone"
        )
        if _meta(sandbox).get("uid") != owner.get("uid"):
            raise PermissionDeniedError(f"Sandbox {namespace}/{owner['name']} is not the pod's owner (uid differs)")
        sandbox_controller = _extension_controller(sandbox)
        incarnation = _incarnation(pod)
        if sandbox_controller is not None:
            return await self._warm(namespace, pod_name, pod_uid, sandbox, sandbox_controller, incarnation)
        sandbox_id = _sandbox_id(pod, sandbox)
        sealed = str((_meta(sandbox).get("annotations") or {}).get(labels.ACTIVATION_PROOF) or "")
        proof = self._sealer.open(sealed, namespace=namespace, name=owner["name"], sandbox_id=sandbox_id)
        if proof is None:
            raise PermissionDeniedError(f"Sandbox {namespace}/{owner['name']} carries no valid activation proof")
        return SupervisorIdentity(
            driver="kubernetes",
            instance_id=InstanceId(pod_uid),
            instance_name=pod_name,
            workspace=str((_meta(sandbox).get("labels") or {}).get(labels.WORKSPACE) or ""),
            binding=Bound(SandboxId(sandbox_id), proof),
            incarnation=incarnation,
        )

    async def _warm(
        self, namespace: str, pod_name: str, pod_uid: str, sandbox: Obj, owner: Mapping[str, Any], incarnation: int
    ) -> SupervisorIdentity:
        """The warm branches: a pool member not claimed yet, or a member a claim of ours adopted."""
        if owner.get("kind") == kube.SANDBOX_CLAIMS.kind:
            claim = await self._live(kube.SANDBOX_CLAIMS, namespace, owner["name"], "the Sandbox's claim is gone")
            if _meta(claim).get("uid") != owner.get("uid") or not claims.is_ours(claim):
                raise PermissionDeniedError(f"SandboxClaim {namespace}/{owner['name']} is not a claim of ours")
            if not claims.runs_requested_shape(claim, sandbox):
                raise PermissionDeniedError(f"Sandbox of SandboxClaim {namespace}/{owner['name']} runs another shape")
            sandbox_id = claims.sandbox_id_of(claim)
            assert sandbox_id is not None  # is_ours checked the label
            sealed = str((_meta(claim).get("annotations") or {}).get(labels.ACTIVATION_PROOF) or "")
            proof = self._sealer.open(sealed, namespace=namespace, name=owner["name"], sandbox_id=sandbox_id)
            if proof is None:
                raise PermissionDeniedError(
                    f"SandboxClaim {namespace}/{owner['name']} carries no valid activation proof"
                )
            workspace = str((_meta(claim).get("labels") or {}).get(labels.WORKSPACE) or "")
            return SupervisorIdentity(
                "kubernetes", InstanceId(pod_uid), pod_name, workspace, Bound(sandbox_id, proof), incarnation
            )
        pool = await self._live(kube.SANDBOX_WARM_POOLS, namespace, owner["name"], "the Sandbox's warm pool is gone")
        pool_labels = _meta(pool).get("labels") or {}
        if (
            _meta(pool).get("uid") != owner.get("uid")
            or pool_labels.get(labels.MANAGED_BY) != labels.MANAGED_BY_VALUE
            or pool_labels.get(labels.WARM_POOL) != labels.WARM_POOL_ENABLED
        ):
            raise PermissionDeniedError(f"SandboxWarmPool {namespace}/{owner['name']} has not opted in to warmshell")
        workspace = str((_meta(pool).get("annotations") or {}).get(labels.WORKSPACE) or "")
        # The shape this member actually runs (its Sandbox's copy of the template at fill time),
        # not what the pool claims today: a stale member must not serve the new shape.
        shape = warmpools.shape_of_template(
            {"metadata": {"annotations": {labels.WORKSPACE: workspace}}, "spec": sandbox.get("spec") or {}}
        )
        if shape is None:
            raise PermissionDeniedError(f"Sandbox {namespace}/{_meta(sandbox).get('name')} is not a warmshell member")
        return SupervisorIdentity(
            "kubernetes", InstanceId(pod_uid), pod_name, workspace, WarmPending(fingerprint(shape))
        )

    async def _review_and_read_pod(self, token: str) -> tuple[str, str, str, Obj]:
        """Steps 1-2, and the live pod for step 3. The pod is read while the review runs, by the
        name the token's payload gives (unverified, a sandbox namespace only); the read is used
        only if the review then names that same pod, and is otherwise discarded and done again."""
        hint = _unverified_pod(token)
        if hint is not None and not naming.namespace_accepted(self._config, hint[0]):
            hint = None
        early = asyncio.ensure_future(self._api.get(kube.PODS, *hint)) if hint is not None else None
        try:
            namespace, pod_name, pod_uid = await self._review(token)
        except BaseException:
            await _discard(early)
            raise
        gone = "the token's pod no longer exists"
        if early is None or hint != (namespace, pod_name):
            await _discard(early)
            return namespace, pod_name, pod_uid, await self._live(kube.PODS, namespace, pod_name, gone)
        try:
            return namespace, pod_name, pod_uid, await early
        except kube.NotFound as exc:
            raise PermissionDeniedError(f"{gone} (Pod {namespace}/{pod_name})") from exc

    async def _review(self, token: str) -> tuple[str, str, str]:
        """Step 1 and 2: (namespace, pod name, pod uid) of an authenticated, pod-bound token."""
        audience = self._config.token_audience
        try:
            status = await self._api.review_token(token, [audience])
        except kube.Rejected as exc:
            raise PermissionDeniedError(f"the gateway may not review tokens: {exc}") from exc
        if status.get("authenticated") is not True:
            raise PermissionDeniedError(f"token not authenticated: {status.get('error') or 'no reason given'}")
        if audience not in (status.get("audiences") or []):
            raise PermissionDeniedError(f"token not valid for audience {audience!r}")
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        namespace, _, account = username.removeprefix(SA_PREFIX).partition(":")
        if not username.startswith(SA_PREFIX) or not account:
            raise PermissionDeniedError(f"{username!r} is not a ServiceAccount")
        if not naming.namespace_accepted(self._config, namespace):
            raise PermissionDeniedError(f"ServiceAccount namespace {namespace!r} is not a sandbox namespace")
        if account != self._config.service_account:
            raise PermissionDeniedError(f"ServiceAccount {account!r} is not the sandbox ServiceAccount")
        extra = user.get("extra") or {}
        return namespace, _single(extra, POD_NAME_EXTRA), _single(extra, POD_UID_EXTRA)

    async def _live(self, resource: kube.Resource, namespace: str, name: str, gone: str) -> Obj:
        try:
            return await self._api.get(resource, namespace, name)
        except kube.NotFound as exc:
            raise PermissionDeniedError(f"{gone} ({resource.kind} {namespace}/{name})") from exc


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _incarnation(pod: Mapping[str, Any]) -> int:
    """How many times the kubelet has restarted the pod's containers (their restartCounts summed):
    a supervisor in a restarted container counts higher than the one before it."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount") or 0) for c in statuses if isinstance(c, Mapping))


def _single(extra: Mapping[str, Any], key: str) -> str:
    values = extra.get(key)
    if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str) or not values[0]:
        raise PermissionDeniedError(f"token is not bound to exactly one pod ({key})")
    return values[0]


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    controllers = [r for r in _meta(pod).get("ownerReferences") or [] if r.get("controller") is True]
    if len(controllers) != 1:
        raise PermissionDeniedError(f"pod has {len(controllers)} controllers; exactly one Sandbox is required")
    owner: Mapping[str, Any] = controllers[0]
    versions = {f"{kube.SANDBOX_GROUP}/{v}" for v in kube.SANDBOX_VERSIONS}
    if owner.get("kind") != "Sandbox" or owner.get("apiVersion") not in versions or not owner.get("name"):
        what = f"{owner.get('apiVersion')} {owner.get('kind')}"
        raise PermissionDeniedError(f"pod is controlled by {what}, not an agent-sandbox Sandbox")
    return owner


def _extension_controller(sandbox: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Sandbox's controlling claim or pool; None for a Sandbox without a controller (a cold
    one warmshell created). Any other controller is refused."""
    controllers = [r for r in _meta(sandbox).get("ownerReferences") or [] if r.get("controller") is True]
    if not controllers:
        return None
    owner: Mapping[str, Any] = controllers[0]
    kinds = (kube.SANDBOX_CLAIMS.kind, kube.SANDBOX_WARM_POOLS.kind)
    group = str(owner.get("apiVersion") or "").split("/", 1)[0]
    if len(controllers) != 1 or group != kube.EXTENSIONS_GROUP or owner.get("kind") not in kinds:
        raise PermissionDeniedError("the pod's Sandbox is controlled by neither a SandboxClaim nor a SandboxWarmPool")
    if not owner.get("name"):
        raise PermissionDeniedError("the pod's Sandbox has a controller without a name")
    return owner


def _sandbox_id(pod: Mapping[str, Any], sandbox: Mapping[str, Any]) -> str:
    sandbox_labels = _meta(sandbox).get("labels") or {}
    if sandbox_labels.get(labels.MANAGED_BY) != labels.MANAGED_BY_VALUE:
        raise PermissionDeniedError("the pod's Sandbox is not managed by warmshell")
    claimed = (_meta(pod).get("annotations") or {}).get(labels.SANDBOX_ID)
    owned = sandbox_labels.get(labels.SANDBOX_ID)
    if not claimed or not owned or claimed != owned:
        raise PermissionDeniedError("the pod's sandbox id does not match its Sandbox's")
    return str(owned)


async def _discard(task: asyncio.Future[Obj] | None) -> None:
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _unverified_pod(token: str) -> tuple[str, str] | None:
    """(namespace, pod name) as a projected token's payload states them, NOT verified: a hint
    for reading ahead, never a fact to decide on."""
    parts = token.split(".")
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        bound = payload["kubernetes.io"]
        namespace, name = bound["namespace"], bound["pod"]["name"]
    except (IndexError, binascii.Error, ValueError, KeyError, TypeError):
        return None
    return (namespace, name) if isinstance(namespace, str) and isinstance(name, str) and namespace and name else None


def looks_like_jwt(credential: str) -> bool:
    """Three base64url parts whose first is a JSON header naming an algorithm."""
    parts = credential.split(".")
    if len(parts) != 3 or not all(parts):
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (binascii.Error, ValueError):
        return False
    return isinstance(header, dict) and "alg" in header
