"""The label and annotation keys warmshell puts on Kubernetes objects, and the ones agent-sandbox
puts there that we read."""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACTIVATION_PROOF",
    "MANAGED_BY",
    "MANAGED_BY_VALUE",
    "POD_NAME",
    "SANDBOX_ID",
    "SANDBOX_NAME",
    "WORKSPACE",
    "managed_selector",
    "sandbox_selector",
]

MANAGED_BY: Final = "warmshell.dev/managed-by"
MANAGED_BY_VALUE: Final = "warmshell"
SANDBOX_ID: Final = "warmshell.dev/sandbox-id"  # label on Sandbox and pod; annotation on the pod
WORKSPACE: Final = "warmshell.dev/workspace"
SANDBOX_NAME: Final = "warmshell.dev/sandbox-name"  # annotation: the user-facing name
ACTIVATION_PROOF: Final = "warmshell.dev/activation-proof"  # sealed, see `proofs`
# agent-sandbox: the Sandbox's pod (= the Sandbox name for cold sandboxes).
POD_NAME: Final = "agents.x-k8s.io/pod-name"


def managed_selector() -> str:
    """Objects of warmshell sandboxes: ours, and carrying a sandbox id (pool members without
    one never enter list or watch)."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{SANDBOX_ID}"


def sandbox_selector(sandbox_id: str) -> str:
    """The objects of one sandbox."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{SANDBOX_ID}={sandbox_id}"
