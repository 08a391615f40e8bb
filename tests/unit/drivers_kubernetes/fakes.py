"""In-process fakes of the cluster the Kubernetes driver reads (for unit tests of one component)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from typing import Any

from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.models import SandboxSpec
from warmshell.drivers.kubernetes import kube, naming, rendering
from warmshell.drivers.kubernetes.proofs import ProofSealer

Obj = dict[str, Any]

NS = "warmshell"
SA = "warmshell-sandbox"
AUDIENCE = "warmshell-gateway"
KEY = bytes(range(32))


def config(**overrides: Any) -> KubernetesDriverConfig:
    return KubernetesDriverConfig(namespace=NS, gateway_address="gw.warmshell.svc:8443", **overrides)


def jwt_like(label: str) -> str:
    """A credential shaped like a JWT (the fake review decides what it means)."""
    header = base64.urlsafe_b64encode(json.dumps({"alg": "RS256"}).encode()).decode().rstrip("=")
    body = base64.urlsafe_b64encode(label.encode()).decode().rstrip("=")
    return f"{header}.{body}.c2ln"


class FakeCluster:
    """Objects by (plural, namespace, name) and TokenReview answers by token."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.reviews: dict[str, Obj] = {}
        self.calls: list[tuple[str, str]] = []

    async def review_token(self, token: str, audiences: Sequence[str]) -> Obj:
        self.calls.append(("review", ",".join(audiences)))
        status = self.reviews.get(token)
        if status is None:
            return {"authenticated": False, "error": "invalid bearer token"}
        granted = [a for a in audiences if a in status.get("_token_audiences", [])]
        if not granted:
            return {"authenticated": False, "error": "token audiences is invalid for the target audiences"}
        return {k: v for k, v in status.items() if not k.startswith("_")} | {"audiences": granted}

    async def get(self, resource: kube.Resource, namespace: str, name: str) -> Obj:
        self.calls.append(("get", f"{resource.plural}/{namespace}/{name}"))
        try:
            return self.objects[(resource.plural, namespace, name)]
        except KeyError:
            raise kube.NotFound(404, "NotFound", f"{resource.plural} {name!r} not found") from None

    # -- building a scene ----------------------------------------------------------------------

    def put(self, plural: str, obj: Obj) -> Obj:
        meta = obj["metadata"]
        self.objects[(plural, meta["namespace"], meta["name"])] = obj
        return obj

    def sandbox_with_pod(
        self,
        *,
        sandbox_id: str = "sbx-1",
        workspace: str = "default",
        name: str = "one",
        proof: str = "the-proof",
        sealer: ProofSealer | None = None,
    ) -> tuple[Obj, Obj]:
        """A Sandbox rendered by the driver, and the pod agent-sandbox would make for it."""
        sealer = sealer or ProofSealer(KEY)
        ref = naming.object_ref(config(), workspace, name)
        sandbox = rendering.render_sandbox(
            config(),
            api_version="agents.x-k8s.io/v1beta1",
            ref=ref,
            who=rendering.SandboxIdentity(
                sandbox_id=sandbox_id,
                workspace=workspace,
                name=name,
                sealed_proof=sealer.seal(proof, namespace=ref.namespace, name=ref.name, sandbox_id=sandbox_id),
            ),
            spec=SandboxSpec(),
        )
        sandbox["metadata"]["uid"] = f"uid-sandbox-{ref.name}"
        template = sandbox["spec"]["podTemplate"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": f"uid-pod-{ref.name}",
                "labels": dict(template["metadata"]["labels"]),
                "annotations": dict(template["metadata"]["annotations"]),
                "ownerReferences": [
                    {
                        "apiVersion": "agents.x-k8s.io/v1beta1",
                        "kind": "Sandbox",
                        "name": ref.name,
                        "uid": sandbox["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        return self.put("sandboxes", sandbox), self.put("pods", pod)

    def token_for(
        self,
        pod: Obj,
        *,
        namespace: str = NS,
        service_account: str = SA,
        audiences: Sequence[str] = (AUDIENCE,),
        extra: Obj | None = None,
        payload_pod: tuple[str, str] | None = None,
    ) -> str:
        """A projected token bound to `pod`, as TokenReview will describe it. Its payload names the
        pod as a real one does (`payload_pod` (namespace, name) makes it lie: only the review counts)."""
        stated_ns, stated_pod = payload_pod or (namespace, pod["metadata"]["name"])
        payload = {
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "kubernetes.io": {"namespace": stated_ns, "pod": {"name": stated_pod}},
            "n": len(self.reviews),  # every token distinct
        }
        token = jwt_like(json.dumps(payload))
        self.reviews[token] = {
            "authenticated": True,
            "_token_audiences": list(audiences),
            "user": {
                "username": f"system:serviceaccount:{namespace}:{service_account}",
                "uid": "sa-uid",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": extra
                if extra is not None
                else {
                    "authentication.kubernetes.io/pod-name": [pod["metadata"]["name"]],
                    "authentication.kubernetes.io/pod-uid": [pod["metadata"]["uid"]],
                },
            },
        }
        return token


class CachedClaims:
    """The informers' cache as the claim controller reads it: these claims, and no Sandbox or pod
    (every chain is read live from the cluster)."""

    def __init__(self, *claims: Obj) -> None:
        self.claims = list(claims)

    def cached_sandbox(self, name: str) -> Obj | None:
        return None

    def cached_pod(self, name: str) -> Obj | None:
        return None

    def cached_claims(self) -> list[Obj]:
        return list(self.claims)

    async def wait_objects_changed(self, generation: int) -> tuple[int, frozenset[str] | None]:
        await asyncio.Event().wait()  # nothing is ever cached here
        return generation, None


def claim_controller(api: Any, activator: Any, *claims: Obj, **options: Any) -> Any:
    """A started claim activation controller on `api`, its informer cache holding `claims`."""
    from warmshell.drivers.kubernetes.warm import claimactivation

    controller = claimactivation.ClaimActivation(api, NS, ProofSealer(KEY), CachedClaims(*claims), **options)
    controller.start(activator)
    return controller
