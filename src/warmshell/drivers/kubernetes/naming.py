"""Where a sandbox lives in the cluster: the one mapping from (workspace, name) to (namespace,
object name), used by every path that creates, finds or checks an object, so further namespace
modes (a namespace per workspace, operator-provisioned namespaces) are added here and only here.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmshell.core.config import KubernetesDriverConfig
from warmshell.core.errors import InvalidArgumentError

__all__ = ["MAX_OBJECT_NAME", "ObjectRef", "namespace_accepted", "object_ref"]

# The Sandbox's pod gets the same name, and pod names must be DNS-1123 labels.
MAX_OBJECT_NAME = 63
SEPARATOR = "--"


@dataclass(frozen=True)
class ObjectRef:
    """A namespaced object name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def object_ref(config: KubernetesDriverConfig, workspace: str, name: str) -> ObjectRef:
    """Shared mode: every workspace in the configured namespace, objects named `{workspace}--{name}`.

    Two pairs can map to one object name (`a--b`/`c` and `a`/`b--c`); the driver's create finds the
    existing object carries another sandbox id and refuses, so a collision never aliases sandboxes.
    """
    object_name = f"{workspace}{SEPARATOR}{name}"
    if len(object_name) > MAX_OBJECT_NAME:
        raise InvalidArgumentError(
            "name", f"{object_name!r} is longer than {MAX_OBJECT_NAME} characters (workspace--name, a pod name)"
        )
    return ObjectRef(config.namespace, object_name)


def namespace_accepted(config: KubernetesDriverConfig, namespace: str) -> bool:
    """Whether sandboxes of this gateway may live in `namespace` (identity checks use this)."""
    return bool(namespace) and namespace == config.namespace
