"""Pure rendering of the agent-sandbox `Sandbox` for a cold warmshell sandbox.

The pod runs the supervisor as its entry point (`warmshell supervisor`); the workload's command
and environment are not in the pod spec — they reach the supervisor in its activation, exactly as
for warm pods that were started before anyone asked for them. The pod proves who it is with a
projected ServiceAccount token for the gateway's audience; the API-server token is not mounted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmshell.core import models
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.models import SandboxSpec
from warmshell.core.quantities import cpu_millis, memory_bytes
from warmshell.drivers.kubernetes import labels
from warmshell.drivers.kubernetes.naming import ObjectRef

__all__ = [
    "CONTAINER",
    "TOKEN_DIR",
    "TOKEN_PATH",
    "WORKSPACE_DIR",
    "SandboxIdentity",
    "container_env",
    "render_sandbox",
]

Obj = dict[str, Any]

CONTAINER = "supervisor"
TOKEN_VOLUME = "warmshell-token"
TOKEN_DIR = "/var/run/secrets/warmshell"
TOKEN_PATH = f"{TOKEN_DIR}/token"
WORKSPACE_VOLUME = "workspace"
# The workload's working directory (core.models.WORKSPACE_DIR): a writable emptyDir here, as the
# local driver's bind mount there.
WORKSPACE_DIR = models.WORKSPACE_DIR


@dataclass(frozen=True)
class SandboxIdentity:
    """Who the rendered object is for."""

    sandbox_id: str
    workspace: str
    name: str
    sealed_proof: str


def render_sandbox(
    config: KubernetesDriverConfig, *, api_version: str, ref: ObjectRef, who: SandboxIdentity, spec: SandboxSpec
) -> Obj:
    """The Sandbox object to create (validates against the agent-sandbox CRD schema)."""
    return {
        "apiVersion": api_version,
        "kind": "Sandbox",
        "metadata": {
            "name": ref.name,
            "namespace": ref.namespace,
            "labels": _labels(who),
            "annotations": {
                labels.SANDBOX_ID: who.sandbox_id,
                labels.SANDBOX_NAME: who.name,
                labels.ACTIVATION_PROOF: who.sealed_proof,
            },
        },
        "spec": {
            "podTemplate": {
                # The pod carries the sandbox id as an annotation; identity compares it with the
                # owning Sandbox's label. The sealed proof stays on the Sandbox only.
                "metadata": {"labels": _labels(who), "annotations": {labels.SANDBOX_ID: who.sandbox_id}},
                "spec": _pod_spec(config, spec),
            },
        },
    }


def _labels(who: SandboxIdentity) -> dict[str, str]:
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.SANDBOX_ID: who.sandbox_id,
        labels.WORKSPACE: who.workspace,
    }


def _pod_spec(config: KubernetesDriverConfig, spec: SandboxSpec) -> Obj:
    uid = config.run_as_user
    pod: Obj = {
        "serviceAccountName": config.service_account,
        # The supervisor never talks to the API server; its only credential is the projected
        # gateway-audience token below.
        "automountServiceAccountToken": False,
        # Never: the supervisor exits when the workload has ended and the gateway has its exit
        # status; restarting it would run the workload a second time. A dead supervisor is a
        # failed sandbox (Error), as on the local driver.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": config.termination_grace_seconds,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            # The kubelet makes projected token files readable by this group.
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(config, spec)],
        "volumes": [
            {
                "name": TOKEN_VOLUME,
                "projected": {
                    "defaultMode": 0o440,
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": config.token_audience,
                                "expirationSeconds": config.token_expiration_seconds,
                                "path": "token",
                            }
                        }
                    ],
                },
            },
            {"name": WORKSPACE_VOLUME, "emptyDir": {}},
        ],
    }
    if spec.runtime_class_name:
        pod["runtimeClassName"] = spec.runtime_class_name
    return pod


def _container(config: KubernetesDriverConfig, spec: SandboxSpec) -> Obj:
    container: Obj = {
        "name": CONTAINER,
        "image": spec.image or config.image,
        # Explicit, so an image whose own entry point is something else still starts the supervisor.
        "command": ["warmshell"],
        "args": ["supervisor"],
        "env": [
            {"name": "WARMSHELL_GATEWAY", "value": config.gateway_address},
            {"name": "WARMSHELL_BOOTSTRAP_FILE", "value": TOKEN_PATH},
            {"name": "WARMSHELL_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        ],
        "volumeMounts": [
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
            {"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_DIR},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    return container


def _resources(spec: SandboxSpec) -> Obj:
    """Requests equal to limits: the sandbox gets what it asked for and no more."""
    amounts: dict[str, str] = {}
    if spec.resources.cpu:
        amounts["cpu"] = f"{cpu_millis(spec.resources.cpu, field='spec.resources.cpu')}m"
    if spec.resources.memory:
        amounts["memory"] = str(memory_bytes(spec.resources.memory, field="spec.resources.memory"))
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def container_env(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The literal env values of the supervisor container (tests and diagnostics)."""
    for container in pod_spec.get("containers") or []:
        if container.get("name") == CONTAINER:
            return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    return {}
