"""Label and annotation keys of the agent-sandbox contract (notes §7), and the API coordinates."""

from __future__ import annotations

SANDBOX_GROUP = "agents.x-k8s.io"
EXT_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
SANDBOX_API_VERSION = f"{SANDBOX_GROUP}/{VERSION}"
EXT_API_VERSION = f"{EXT_GROUP}/{VERSION}"

SANDBOX_NAME_HASH = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL_SANDBOX = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH = "agents.x-k8s.io/sandbox-template-ref-hash"
TEMPLATE_HASH = "agents.x-k8s.io/sandbox-template-hash"
POD_TEMPLATE_HASH = "agents.x-k8s.io/sandbox-pod-template-hash"
LAUNCH_TYPE = "agents.x-k8s.io/launch-type"
CREATED_BY = "agents.x-k8s.io/created-by"
CLAIM_UID = "agents.x-k8s.io/claim-uid"
ADOPTABLE = "agents.x-k8s.io/adoptable"

POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
TEMPLATE_REF_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
PROPAGATED_LABELS = "agents.x-k8s.io/propagated-labels"
PROPAGATED_ANNOTATIONS = "agents.x-k8s.io/propagated-annotations"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
CLAIM_SANDBOX_NAME = "agents.x-k8s.io/sandbox-name"
CONTROLLER_FIRST_OBSERVED = "agents.x-k8s.io/controller-first-observed-at"
CLAIM_FIRST_READY = "agents.x-k8s.io/claim-first-ready-at"
TRACE_CONTEXT = "opentelemetry.io/trace-context"

_CREATED_BY_ALLOWED = frozenset({"go-client", "python-client", "controller"})


def is_system_key(key: str) -> bool:
    """Keys under the agent-sandbox prefixes are never copied from a pod template to a Pod."""
    return key.startswith(("agents.x-k8s.io/", "extensions.agents.x-k8s.io/"))


def is_system_annotation(key: str) -> bool:
    return is_system_key(key) or key == TRACE_CONTEXT


def normalize_created_by(value: str) -> str:
    """The Pod gets only allow-listed ``created-by`` values (upstream ``NormalizeCreatedBy``)."""
    return value if value in _CREATED_BY_ALLOWED else "unknown"
