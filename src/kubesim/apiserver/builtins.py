"""Per-kind defaulting and validation for the built-in kinds, as their registry strategies do.

Only what clients observe is modelled: pod defaults and spec immutability, namespace phase and
label, secret ``stringData``, service cluster IPs, RBAC objects (``rbac_objects``). Everything else
is stored as sent.
"""

from __future__ import annotations

import base64
import itertools
import random
from typing import Any

from kubesim.apiserver import rbac_objects, workloads
from kubesim.apiserver.schema import FieldError

_cluster_ips = random.SystemRandom()

_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def _err(field: str, reason: str, message: str) -> FieldError:
    return {"field": field, "reason": reason, "message": message}


def _default_container(c: dict[str, Any]) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = c.get("image", "")
    tag = image.rsplit("/", 1)[-1]
    latest = ":" not in tag or tag.endswith(":latest")
    c.setdefault("imagePullPolicy", "Always" if latest and "@" not in tag else "IfNotPresent")
    c.setdefault("resources", {})


def default_pod(pod: dict[str, Any]) -> None:
    """Fill the defaults the pod strategy and admission add on create."""
    spec = pod.setdefault("spec", {})
    default_pod_spec(spec)
    pod["status"] = {"phase": "Pending", "qosClass": _qos(spec)}


def default_pod_spec(spec: dict[str, Any]) -> None:
    """The PodSpec defaults (also applied to the pod templates of workloads)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for c in itertools.chain(spec.get("containers") or [], spec.get("initContainers") or []):
        if isinstance(c, dict):
            _default_container(c)


def _qos(spec: dict[str, Any]) -> str:
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(k)
        and (r.get("requests") or {}).get(k, (r.get("limits") or {}).get(k)) == (r.get("limits") or {}).get(k)
        for r in resources
        for k in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def validate_pod(pod: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Containers are required; on update only a few spec fields may change."""
    spec = pod.get("spec") or {}
    errs: list[FieldError] = []
    containers = spec.get("containers")
    if not containers:
        errs.append(_err("spec.containers", "FieldValueRequired", "Required value"))
    else:
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name"):
                errs.append(_err(f"spec.containers[{i}].name", "FieldValueRequired", "Required value"))
            if isinstance(c, dict) and not c.get("image"):
                errs.append(_err(f"spec.containers[{i}].image", "FieldValueRequired", "Required value"))
    old_spec = (old.get("spec") or {}) if old is not None else None
    # Most pod writes (the kubelet's status, finalizers, labels) leave the spec as it was: one
    # equality test in C instead of masking both specs (two copies per write, ~9 % of the API
    # server's CPU during a warm-create burst).
    if old_spec is not None and spec != old_spec and _masked_spec(spec) != _masked_spec(old_spec):
        errs.append(
            _err(
                "spec",
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                "(allow it to be set to 1 if it was previously negative)",
            )
        )
    return errs


def _masked_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec without the fields a pod update may change, for comparison only: a shallow
    copy (the containers' too) sharing everything it does not drop."""
    masked = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
    for key in ("containers", "initContainers"):
        listed = masked.get(key)
        if isinstance(listed, list):
            masked[key] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in listed]
    return masked


def default_namespace(ns: dict[str, Any]) -> None:
    """Namespaces start Active with the ``kubernetes`` finalizer and their name label."""
    name = ns["metadata"]["name"]
    ns["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    ns.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    ns["status"] = {"phase": "Active"}


def default_secret(secret: dict[str, Any]) -> None:
    """Fold ``stringData`` into base64 ``data`` and default the type, as the secret strategy does."""
    string_data = secret.pop("stringData", None)
    if isinstance(string_data, dict):
        data = secret.setdefault("data", {})
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
    secret.setdefault("type", "Opaque")


def default_service(svc: dict[str, Any]) -> None:
    """Allocate a cluster IP and default port protocols."""
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("clusterIP") != "None":
        # Loopback addresses (all of 127/8 is local on Linux): never a real network. Random, so
        # that several kubesim instances on one machine rarely pick the same address and port.
        n = _cluster_ips.randrange(1, 254 * 254)
        spec.setdefault("clusterIP", f"127.42.{n // 254}.{n % 254 + 1}")
    if spec.get("clusterIP"):
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
    node_ports = spec.get("type") in ("NodePort", "LoadBalancer")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
            if node_ports:
                # The default NodePort range; the proxy listens on it at the nodes' 127.0.0.1.
                port.setdefault("nodePort", _cluster_ips.randrange(30000, 32768))
    svc.setdefault("status", {"loadBalancer": {}})


def _default_workload(plural: str, obj: dict[str, Any]) -> None:
    workloads.default(plural, obj)
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict):
        default_pod_spec(template.setdefault("spec", {}))


def on_create(group: str, plural: str, obj: dict[str, Any]) -> None:
    """Apply create-time defaults for a built-in kind."""
    if group == workloads.GROUP:
        _default_workload(plural, obj)
        return
    if group == rbac_objects.GROUP:
        rbac_objects.default(plural, obj)
        return
    if group != "":
        return
    if plural == "pods":
        default_pod(obj)
    elif plural == "namespaces":
        default_namespace(obj)
    elif plural == "secrets":
        default_secret(obj)
    elif plural == "services":
        default_service(obj)


def on_update(group: str, plural: str, obj: dict[str, Any]) -> None:
    """Apply update-time defaults for a built-in kind."""
    if group == workloads.GROUP:
        _default_workload(plural, obj)
    elif group == "" and plural == "secrets":
        default_secret(obj)
    elif group == rbac_objects.GROUP:
        rbac_objects.default(plural, obj)


def validate(group: str, plural: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Field errors for a built-in kind (empty when valid)."""
    if group == "" and plural == "pods":
        return validate_pod(obj, old)
    if group == rbac_objects.GROUP:
        return rbac_objects.validate(plural, obj, old)
    if group == workloads.GROUP:
        return workloads.validate(plural, obj, old)
    return []
