"""The Kubernetes compute driver: sandboxes as agent-sandbox `Sandbox` objects, supervisors
identified by their pods' projected ServiceAccount tokens."""

from warmshell.drivers.kubernetes.driver import KubernetesDriver

__all__ = ["KubernetesDriver"]
