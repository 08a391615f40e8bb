"""The label and annotation keys warmshell puts on Kubernetes objects, and the ones agent-sandbox
puts there that we read."""

from __future__ import annotations

import re
from typing import Final

from warmshell.core.ids import SandboxId

__all__ = [
    "ACCEPTED_ENVIRONMENT",
    "ACTIVATION_PROOF",
    "ALLOCATION",
    "ALLOCATION_CLAIM",
    "FINGERPRINT",
    "FINGERPRINT_LABEL_LENGTH",
    "GATEWAY_ID",
    "IDLE_TIMEOUT_SECONDS",
    "MANAGED_BY",
    "MANAGED_BY_VALUE",
    "NETWORK_ALLOW",
    "NETWORK_DENY",
    "POD_NAME",
    "PROFILE",
    "PROFILE_DATA_KEY",
    "PROFILE_ENABLED",
    "PROFILE_FINGERPRINT",
    "PROFILE_GENERATED",
    "PROFILE_LAST_ERROR",
    "PROFILE_NAME",
    "PROFILE_OBSERVED_VERSION",
    "PROFILE_SOURCE",
    "PROFILE_STATUS",
    "PROFILE_TARGET_NAMESPACE",
    "PROFILE_UID",
    "SANDBOX_ID",
    "SANDBOX_NAME",
    "SECRET_HOSTS",
    "TTL_SECONDS",
    "WARM_POOL",
    "WARM_POOL_ENABLED",
    "WORKSPACE",
    "WORKSPACE_SIZE",
    "claim_selector",
    "generated_selector",
    "label_value",
    "managed_selector",
    "profile_selector",
    "sandbox_selector",
    "warm_pool_selector",
]

MANAGED_BY: Final = "warmshell.dev/managed-by"
MANAGED_BY_VALUE: Final = "warmshell"
SANDBOX_ID: Final = "warmshell.dev/sandbox-id"  # label on Sandbox and pod; annotation on the pod
WORKSPACE: Final = "warmshell.dev/workspace"
SANDBOX_NAME: Final = "warmshell.dev/sandbox-name"  # annotation: the user-facing name
ACTIVATION_PROOF: Final = "warmshell.dev/activation-proof"  # sealed, see `proofs`
# Warm pools (SandboxTemplate + SandboxWarmPool): the opt-in the pool cache watches, and the
# fingerprint of the shape they serve — a label (first 40 hex: label values are at most 63 chars) to
# select by, and an annotation (all 64 hex) to compare with.
WARM_POOL: Final = "warmshell.dev/warm-pool"
WARM_POOL_ENABLED: Final = "enabled"
FINGERPRINT: Final = "warmshell.dev/fingerprint"
FINGERPRINT_LABEL_LENGTH: Final = 40
# On a warm pool: the lifetime defaults of the sandboxes it serves, in seconds ("" or absent: the
# gateway's default; "0": no limit). Written from a profile's [lifetime]; not part of the shape.
TTL_SECONDS: Final = "warmshell.dev/ttl-seconds"
IDLE_TIMEOUT_SECONDS: Final = "warmshell.dev/idle-timeout-seconds"
# On a warm pool: its profile's `[network]` allow and deny lists and `[activation] secret_hosts`,
# as JSON (allow "" or absent: the gateway's default). Applied at activation and by the egress
# proxy on every connection; not part of the shape.
NETWORK_ALLOW: Final = "warmshell.dev/network-allow"
NETWORK_DENY: Final = "warmshell.dev/network-deny"
SECRET_HOSTS: Final = "warmshell.dev/secret-hosts"
# On a warm pool's template: its profile's [storage] workspace, the workspace volume's sizeLimit
# ("" = none). Not part of the shape; there so that removing it from a profile is seen as a change.
WORKSPACE_SIZE: Final = "warmshell.dev/workspace-size"
# On a warm pool's pod template: the environment patterns its members accept at activation
# (comma-separated; the names, never a value). Part of the shape read back from a member.
ACCEPTED_ENVIRONMENT: Final = "warmshell.dev/accepted-environment"
# SandboxClaims: how a sandbox was allocated, and which gateway created the claim.
ALLOCATION: Final = "warmshell.dev/allocation"
ALLOCATION_CLAIM: Final = "sandbox-claim"
GATEWAY_ID: Final = "warmshell.dev/gateway-id"
# agent-sandbox: the Sandbox's pod (= the Sandbox name for cold sandboxes).
POD_NAME: Final = "agents.x-k8s.io/pod-name"


def managed_selector() -> str:
    """Objects of warmshell sandboxes: ours, and carrying a sandbox id (pool members without
    one never enter list or watch)."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{SANDBOX_ID}"


def sandbox_selector(sandbox_id: SandboxId) -> str:
    """The objects of one sandbox."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{SANDBOX_ID}={sandbox_id}"


def warm_pool_selector() -> str:
    """Warm pools and templates that opted in to warmshell's allocation."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{WARM_POOL}={WARM_POOL_ENABLED}"


def claim_selector() -> str:
    """SandboxClaims warmshell created for its sandboxes."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{ALLOCATION}={ALLOCATION_CLAIM},{SANDBOX_ID}"


# -- warm-pool profiles (ConfigMaps holding warm-pool.toml; see `profileplan`) -------------------
# The opt-in on a ConfigMap, and the data key holding the profile.
PROFILE: Final = "warmshell.dev/warm-pool-profile"
PROFILE_ENABLED: Final = "true"
PROFILE_DATA_KEY: Final = "warm-pool.toml"
# On generated templates and pools: which profile made them (name sanitised as a label value).
PROFILE_NAME: Final = "warmshell.dev/warm-pool-profile-name"
PROFILE_UID: Final = "warmshell.dev/warm-pool-profile-uid"
PROFILE_SOURCE: Final = "warmshell.dev/warm-pool-profile-source"  # annotation: <namespace>/<name>
# Status the reconciler reports on the ConfigMap (annotations).
PROFILE_STATUS: Final = "warmshell.dev/warm-pool-status"  # Ready | Error
PROFILE_LAST_ERROR: Final = "warmshell.dev/warm-pool-last-error"
PROFILE_OBSERVED_VERSION: Final = "warmshell.dev/warm-pool-observed-resource-version"
PROFILE_TARGET_NAMESPACE: Final = "warmshell.dev/warm-pool-target-namespace"
PROFILE_GENERATED: Final = "warmshell.dev/warm-pool-generated"  # the template + pool name(s)
PROFILE_FINGERPRINT: Final = "warmshell.dev/warm-pool-fingerprint"


def profile_selector() -> str:
    """ConfigMaps that opted in as warm-pool profiles."""
    return f"{PROFILE}={PROFILE_ENABLED}"


def generated_selector() -> str:
    """Templates and pools the profile reconciler generated (whatever profile made them)."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{PROFILE_UID}"


def label_value(text: str) -> str:
    """`text` as a valid label value: allowed characters only, at most 63, alphanumeric ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("._-") or "gateway"
