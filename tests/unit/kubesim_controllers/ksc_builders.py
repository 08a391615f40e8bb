"""Builders for the pure controller tests: objects shaped as the API server returns them."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def make_template(name: str = "tmpl", **spec: Any) -> Obj:
    base: Obj = {
        "podTemplate": {
            "metadata": {"labels": {"app": "agent"}, "annotations": {"team": "a"}},
            "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"]}]},
        },
        "networkPolicyManagement": "Managed",
        "envVarsInjectionPolicy": "Disallowed",
        "volumeClaimTemplatesPolicy": "Disallowed",
    }
    base.update(spec)
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name, "namespace": "ns1", "uid": "tmpl-uid", "resourceVersion": "3"},
        "spec": base,
    }


def make_pool(name: str = "pool", replicas: int = 2, template: str = "tmpl") -> Obj:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "uid": "pool-uid",
            "generation": 4,
            "resourceVersion": "5",
        },
        "spec": {
            "replicas": replicas,
            "sandboxTemplateRef": {"name": template},
            "updateStrategy": {"type": "OnReplenish"},
        },
    }


def make_claim(name: str = "claim", pool: str = "pool", **spec: Any) -> Obj:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "uid": "claim-uid",
            "generation": 1,
            "resourceVersion": "9",
            "labels": {"agents.x-k8s.io/created-by": "python-client"},
        },
        "spec": {"warmPoolRef": {"name": pool}, **spec},
    }
