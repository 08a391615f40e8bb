"""The ServiceAccount admission plugin's pod mutation: unless the pod or its ServiceAccount opts
out (``automountServiceAccountToken: false``), every container gets the ``kube-api-access-<id>``
projected volume at ``/var/run/secrets/kubernetes.io/serviceaccount`` — a bound token, the
cluster CA (ConfigMap ``kube-root-ca.crt``, which ``gc`` publishes in every namespace) and the
namespace — which is what in-cluster client configuration reads.
"""

from __future__ import annotations

import secrets
from typing import Any

from kubesim.apiserver.resources import ResourceType
from kubesim.apiserver.store import Store, Stored

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
# Upstream's default: one hour plus seven seconds, so the kubelet's refresh is never late.
TOKEN_SECONDS = 3607
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"


def api_access_volume(name: str) -> dict[str, Any]:
    """The projected volume the plugin adds."""
    return {
        "name": name,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ],
        },
    }


def _wants_token(pod: dict[str, Any], account: dict[str, Any] | None) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("automountServiceAccountToken") is not None:
        return bool(spec["automountServiceAccountToken"])
    if account is not None and account.get("automountServiceAccountToken") is not None:
        return bool(account["automountServiceAccountToken"])
    return True


def mount_token(pod: dict[str, Any], account: dict[str, Any] | None) -> None:
    """Add the API-access volume and its mounts to a new pod, as the plugin does (in place)."""
    if not _wants_token(pod, account):
        return
    spec = pod.setdefault("spec", {})
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or [] if isinstance(c, dict)]
    if any(m.get("mountPath") == MOUNT_PATH for c in containers for m in c.get("volumeMounts") or []):
        return  # the pod brings its own
    name = "kube-api-access-" + "".join(secrets.choice(_ALPHANUMS) for _ in range(5))
    spec.setdefault("volumes", []).append(api_access_volume(name))
    for c in containers:
        c.setdefault("volumeMounts", []).append({"name": name, "readOnly": True, "mountPath": MOUNT_PATH})


def admission(store: Store) -> Any:
    """An ``Rest.admission`` hook mutating pods on create."""

    def admit(rt: ResourceType, new: dict[str, Any], old: Stored | None) -> None:
        if old is not None or rt.key != ("", "pods"):
            return
        ns = new["metadata"].get("namespace", "")
        sa_name = (new.get("spec") or {}).get("serviceAccountName") or "default"
        found = store.get("", "serviceaccounts", ns, sa_name)
        mount_token(new, found.obj if found is not None else None)

    return admit
