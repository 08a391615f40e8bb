"""Pure rendering of the agent-sandbox `Sandbox` for a cold warmshell sandbox.

Every sandbox pod has two containers. The `supervisor` (the warmshell image, `warmshell
supervisor`) alone holds the projected ServiceAccount token for the gateway's audience and talks
to the gateway. The `workload` runs the request's image with the same C agent as the local
driver's as its pid 1, copied from the warmshell image into an `emptyDir` by an init container
(`warmshell-agent --install`: the agent copies itself, no Python process), so any image works
unchanged; the agent connects to the supervisor's Unix socket on another `emptyDir` both mount,
and every exec, terminal, signal and the workload command go through it. The workload's command
and environment are not in the pod spec — they reach the supervisor in its activation, exactly as
for warm pods that were started before anyone asked for them. The API-server token is mounted nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmshell.core import models
from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.ids import SandboxId
from warmshell.core.models import SandboxSpec
from warmshell.drivers.kubernetes import labels
from warmshell.drivers.kubernetes.naming import ObjectRef
from warmshell.drivers.kubernetes.objects import Obj

__all__ = [
    "AGENT_DIR",
    "AGENT_SOCKET",
    "CONTAINER",
    "INIT_CONTAINER",
    "RESERVED_ENV",
    "RESTART_POLICY",
    "TOKEN_DIR",
    "TOKEN_PATH",
    "WORKLOAD_CONTAINER",
    "WORKSPACE_DIR",
    "SandboxIdentity",
    "container_env",
    "pod_spec",
    "render_sandbox",
    "workspace_claims",
]


CONTAINER = "supervisor"
WORKLOAD_CONTAINER = "workload"
INIT_CONTAINER = "install-agent"
# The agent binary (written by the init container, read-only in the workload) and the channel
# between the two containers; paths no image uses, so no image's own files are hidden.
AGENT_VOLUME = "warmshell-agent"
AGENT_DIR = "/.warmshell/agent"
CHANNEL_VOLUME = "warmshell-channel"
CHANNEL_DIR = "/.warmshell/channel"
AGENT_SOCKET = f"{CHANNEL_DIR}/agent.sock"
AGENT_COMMAND = (f"{AGENT_DIR}/warmshell-agent", "--connect", AGENT_SOCKET)
# The agent on the warmshell image's PATH (the Dockerfile links it there).
AGENT_PROGRAM = "warmshell-agent"
TOKEN_VOLUME = "warmshell-token"
TOKEN_DIR = "/var/run/secrets/warmshell"
TOKEN_PATH = f"{TOKEN_DIR}/token"
WORKSPACE_VOLUME = "workspace"
# The workload's working directory (core.models.WORKSPACE_DIR): a writable emptyDir here, as the
# local driver's bind mount there.
WORKSPACE_DIR = models.WORKSPACE_DIR
# The supervisor's own settings in the container env; everything else there is a pool's baked-in
# environment (part of its shape).
RESERVED_ENV: frozenset[str] = frozenset(
    {
        "WARMSHELL_GATEWAY",
        "WARMSHELL_BOOTSTRAP_FILE",
        "WARMSHELL_INSTANCE_ID",
        "WARMSHELL_RESTART_POLICY",
        "WARMSHELL_AGENT_SOCKET",
    }
)
# The pod's restartPolicy, also told to the supervisor (it chooses its exit status by it).
RESTART_POLICY = "OnFailure"


@dataclass(frozen=True)
class SandboxIdentity:
    """Who the rendered object is for."""

    sandbox_id: SandboxId
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
                "spec": pod_spec(
                    config,
                    image=spec.image or config.image,
                    cpu_millis=spec.resources.cpu_millis,
                    memory_bytes=spec.resources.memory_bytes,
                    runtime_class_name=spec.runtime_class_name,
                    workspace_size=spec.storage.workspace,
                ),
            },
            **workspace_claims(config, workspace_size=spec.storage.workspace),
        },
    }


def workspace_claims(config: KubernetesDriverConfig, *, workspace_size: str) -> Obj:
    """The `volumeClaimTemplates` of a Sandbox (or SandboxTemplate) whose /workspace is a claim
    (`kubernetes.workspace_claim_size`); {} for an emptyDir. The claim has the workspace volume's
    name, so agent-sandbox mounts it in the volume's place in both containers."""
    if not config.workspace_claim_size:
        return {}
    size = workspace_size or config.workspace_claim_size
    claim: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if config.workspace_storage_class:
        claim["storageClassName"] = config.workspace_storage_class
    return {"volumeClaimTemplates": [{"metadata": {"name": WORKSPACE_VOLUME}, "spec": claim}]}


def _labels(who: SandboxIdentity) -> dict[str, str]:
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.SANDBOX_ID: who.sandbox_id,
        labels.WORKSPACE: who.workspace,
    }


def pod_spec(
    config: KubernetesDriverConfig,
    *,
    image: str,
    cpu_millis: int = 0,
    memory_bytes: int = 0,
    runtime_class_name: str = "",
    environment: Mapping[str, str] | None = None,
    workspace_size: str = "",
) -> Obj:
    """The pod of every warmshell sandbox, cold or warm: `image` is the workload's (see the
    module doc; the supervisor and the init container run `config.image`).

    `environment` is only for warm-pool templates: a pool bakes its shape's environment into the
    container so the shape can be verified from the template (`warmpools.shape_of_template`); a
    cold sandbox's environment travels in the activation instead. `workspace_size` (a profile's
    `[storage] workspace`; "" = unbounded) is the workspace emptyDir's sizeLimit: the kubelet
    evicts a pod that writes more there.
    """
    pod: Obj = {
        "serviceAccountName": config.service_account,
        # The supervisor never talks to the API server; its only credential is the projected
        # gateway-audience token below.
        "automountServiceAccountToken": False,
        # OnFailure: a supervisor that crashes (SIGKILL, OOM, a bug) is started again in the same
        # pod, registers again with the same pod's token and is activated again for the same
        # sandbox. Told so through WARMSHELL_RESTART_POLICY, the supervisor exits 0 once the gateway
        # has ended the sandbox (the workload's exit status is recorded there, not in the
        # container's), so a workload that exited, even non-zero, is never run a second time; and
        # a sandbox that is over refuses a restarted supervisor's registration, which also exits 0.
        # A supervisor that keeps failing is a failed sandbox after status.RESTART_LIMIT restarts,
        # as a Job with this policy fails at its backoffLimit.
        "restartPolicy": RESTART_POLICY,
        "terminationGracePeriodSeconds": config.termination_grace_seconds,
        "enableServiceLinks": False,
        "securityContext": _pod_security(config.run_as_user),
        "initContainers": [_install_agent(config)],
        "containers": [
            _supervisor(config, environment=environment or {}),
            _workload(config, image=image, cpu_millis=cpu_millis, memory_bytes=memory_bytes),
        ],
        "volumes": _volumes(config, workspace_size=workspace_size),
    }
    if runtime_class_name:
        pod["runtimeClassName"] = runtime_class_name
    return pod


def _pod_security(uid: int) -> Obj:
    """Every container non-root as `uid`, under the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        # The kubelet makes projected token files readable by this group.
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _volumes(config: KubernetesDriverConfig, *, workspace_size: str) -> list[Obj]:
    """The projected gateway-audience token (mounted into the supervisor only), the workspace,
    the agent's binary and the channel (emptyDirs)."""
    token = {
        "audience": config.token_audience,
        "expirationSeconds": config.token_expiration_seconds,
        "path": "token",
    }
    return [
        {"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o440, "sources": [{"serviceAccountToken": token}]}},
        {"name": WORKSPACE_VOLUME, "emptyDir": {"sizeLimit": workspace_size} if workspace_size else {}},
        {"name": AGENT_VOLUME, "emptyDir": {}},
        {"name": CHANNEL_VOLUME, "emptyDir": {}},
    ]


# No privilege in any container: nothing to escalate to, no capability to use.
_LOCKED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _warmshell_image(config: KubernetesDriverConfig, name: str, program: str, args: list[str]) -> Obj:
    container: Obj = {
        "name": name,
        "image": config.image,
        # Explicit, so an image whose own entry point is something else still runs warmshell's.
        "command": [program],
        "args": args,
        "securityContext": dict(_LOCKED),
    }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    return container


def _install_agent(config: KubernetesDriverConfig) -> Obj:
    """The init container: the static agent from the warmshell image into the agent volume, copied
    by the agent itself (`warmshell install-agent`, a Python start, cost each pod ~4 ms of CPU
    forked on kubesim and ~40 ms as the fresh interpreter a cluster's container is)."""
    container = _warmshell_image(config, INIT_CONTAINER, AGENT_PROGRAM, ["--install", AGENT_DIR])
    container["volumeMounts"] = [{"name": AGENT_VOLUME, "mountPath": AGENT_DIR}]
    return container


def _supervisor(config: KubernetesDriverConfig, *, environment: Mapping[str, str]) -> Obj:
    reserved = RESERVED_ENV.intersection(environment)
    if reserved:
        raise ValueError(f"environment may not set {sorted(reserved)}: the supervisor's own settings")
    container = _warmshell_image(config, CONTAINER, "warmshell", ["supervisor"])
    container["env"] = [
        {"name": "WARMSHELL_GATEWAY", "value": config.gateway_address},
        {"name": "WARMSHELL_BOOTSTRAP_FILE", "value": TOKEN_PATH},
        {"name": "WARMSHELL_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "WARMSHELL_RESTART_POLICY", "value": RESTART_POLICY},
        {"name": "WARMSHELL_AGENT_SOCKET", "value": AGENT_SOCKET},
        *({"name": k, "value": v} for k, v in sorted(environment.items())),
    ]
    container["volumeMounts"] = [
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
        {"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_DIR},
        {"name": CHANNEL_VOLUME, "mountPath": CHANNEL_DIR},
    ]
    return container


def _workload(config: KubernetesDriverConfig, *, image: str, cpu_millis: int, memory_bytes: int) -> Obj:
    """The request's image, the agent as its pid 1: no token, no privilege, the sandbox's limits."""
    container: Obj = {
        "name": WORKLOAD_CONTAINER,
        "image": image,
        "command": list(AGENT_COMMAND),
        "volumeMounts": [
            {"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_DIR},
            {"name": AGENT_VOLUME, "mountPath": AGENT_DIR, "readOnly": True},
            {"name": CHANNEL_VOLUME, "mountPath": CHANNEL_DIR},
        ],
        "securityContext": dict(_LOCKED),
    }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    resources = _resources(cpu_millis, memory_bytes)
    if resources:
        container["resources"] = resources
    return container


def _resources(cpu_millis: int, memory_bytes: int) -> Obj:
    """Requests equal to limits: the sandbox gets what it asked for and no more (0: no request)."""
    amounts: dict[str, str] = {}
    if cpu_millis:
        amounts["cpu"] = f"{cpu_millis}m"
    if memory_bytes:
        amounts["memory"] = str(memory_bytes)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def container_env(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The literal env values of the supervisor container (tests and diagnostics)."""
    for container in pod_spec.get("containers") or []:
        if container.get("name") == CONTAINER:
            return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    return {}
