"""Pure status computation for the Sandbox controller (notes §3, upstream ``computeReadyCondition``,
``computeSuspendedCondition``, ``computePodScheduledCondition``, ``computeFinishedCondition``)."""

from __future__ import annotations

import datetime
from typing import Any

from kubesim.controllers import objects as o
from kubesim.controllers.hashing import name_hash

Obj = dict[str, Any]


def _cond(ctype: str, status: str, reason: str, message: str, generation: int) -> Obj:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def ready_condition(sandbox: Obj, pod: Obj | None, *, service_exists: bool | None) -> Obj:
    """Ready: True only for a Running, PodReady pod with IPs (and a Service when one is required).

    ``service_exists`` is None when no Service is required.
    """
    gen = int(sandbox.get("metadata", {}).get("generation") or 0)
    if sandbox.get("spec", {}).get("operatingMode") == "Suspended":
        msg = "Sandbox is suspending" if pod is not None else "Sandbox is suspended"
        return _cond("Ready", "False", "SandboxSuspended", msg, gen)
    phase = (pod or {}).get("status", {}).get("phase") or "Pending"
    if pod is not None and phase == "Succeeded":
        return _cond("Ready", "False", "PodSucceeded", "Pod completed successfully", gen)
    if pod is not None and phase == "Failed":
        return _cond("Ready", "False", "PodFailed", "Pod failed", gen)
    pod_ready = False
    if pod is None:
        message = "Pod does not exist"
    elif phase != "Running":
        message = f"Pod exists with phase: {phase}"
    else:
        message = "Pod is Running but not Ready"
        ready = o.get_condition(pod.get("status", {}).get("conditions"), "Ready")
        if ready is not None and ready.get("status") == "True":
            if pod.get("status", {}).get("podIPs"):
                message, pod_ready = "Pod is Ready", True
            else:
                message = "Pod is Ready but has no podIPs yet"
    svc_ready = True
    if service_exists is not None:
        svc_ready = service_exists
        message += "; Service Exists" if service_exists else "; Service does not exist"
    if pod_ready and svc_ready:
        return _cond("Ready", "True", "DependenciesReady", message, gen)
    return _cond("Ready", "False", "DependenciesNotReady", message, gen)


def suspended_condition(sandbox: Obj, pod: Obj | None) -> Obj:
    gen = int(sandbox.get("metadata", {}).get("generation") or 0)
    if sandbox.get("spec", {}).get("operatingMode") != "Suspended":
        return _cond("Suspended", "False", "NotSuspended", "Sandbox is not suspended", gen)
    if pod is None:
        return _cond("Suspended", "True", "PodTerminated", "Pod has been terminated. Sandbox is suspended", gen)
    return _cond("Suspended", "False", "PodTerminating", "Pod is terminating. Sandbox is suspending", gen)


def pod_scheduled_condition(sandbox: Obj, pod: Obj | None) -> Obj | None:
    if pod is None:
        return None
    gen = int(sandbox.get("metadata", {}).get("generation") or 0)
    pcond = o.get_condition(pod.get("status", {}).get("conditions"), "PodScheduled")
    if pcond is None:
        return _cond(
            "PodScheduled",
            "Unknown",
            "PodSchedulingUnknown",
            "Pod has not reported a PodScheduled condition yet",
            gen,
        )
    status = str(pcond.get("status", "Unknown"))
    reason = pcond.get("reason") or ("PodScheduled" if status == "True" else "PodSchedulingUnknown")
    return _cond("PodScheduled", status, reason, str(pcond.get("message") or ""), gen)


def finished_condition(sandbox: Obj, pod: Obj | None) -> Obj | None:
    if pod is None:
        return None
    gen = int(sandbox.get("metadata", {}).get("generation") or 0)
    phase = pod.get("status", {}).get("phase")
    if phase == "Succeeded":
        return _cond("Finished", "True", "PodSucceeded", "Pod completed successfully", gen)
    if phase == "Failed":
        return _cond("Finished", "True", "PodFailed", "Pod failed", gen)
    return None


def sandbox_status(
    sandbox: Obj,
    pod: Obj | None,
    *,
    service_name: str | None,
    service_required: bool,
    at: datetime.datetime,
    ready_override: Obj | None = None,
) -> Obj:
    """The whole desired ``status`` of a Sandbox given its owned Pod (or None)."""
    old = sandbox.get("status") or {}
    conds: list[Obj] = list(old.get("conditions") or [])
    ready = ready_override or ready_condition(
        sandbox, pod, service_exists=(service_name is not None) if service_required else None
    )
    conds = o.set_condition(conds, ready, at=at)
    conds = o.set_condition(conds, suspended_condition(sandbox, pod), at=at)
    for ctype, cond in (
        ("PodScheduled", pod_scheduled_condition(sandbox, pod)),
        ("Finished", finished_condition(sandbox, pod)),
    ):
        conds = o.set_condition(conds, cond, at=at) if cond else o.remove_condition(conds, ctype)
    conds.sort(key=lambda c: str(c.get("type")))
    status: Obj = {"conditions": conds}
    if old.get("selector"):
        status["selector"] = old["selector"]
    if pod is not None:
        status["selector"] = f"agents.x-k8s.io/sandbox-name-hash={name_hash(o.name_of(sandbox))}"
        ips = [str(ip.get("ip")) for ip in pod.get("status", {}).get("podIPs") or [] if ip.get("ip")]
        if ips:
            status["podIPs"] = ips
        node = pod.get("spec", {}).get("nodeName")
        if node:
            status["nodeName"] = node
    if service_name:
        status["service"] = service_name
        ns = o.namespace_of(sandbox)
        status["serviceFQDN"] = f"{service_name}.{ns}.svc.cluster.local"
    return status


_STATUS_KEYS = ("conditions", "selector", "podIPs", "nodeName", "service", "serviceFQDN")


def status_patch(old: Obj, new: Obj) -> Obj | None:
    """Merge patch from ``old`` to ``new`` status, or None when nothing is worth writing.

    A change of only ``nodeName`` while the Sandbox is not Ready is held back (upstream #1225): it
    rides along with the next write, normally the Ready transition.
    """
    patch: Obj = {}
    for key in _STATUS_KEYS:
        if old.get(key) != new.get(key):
            patch[key] = new.get(key)
    if not patch:
        return None
    ready = o.get_condition(new.get("conditions"), "Ready")
    if set(patch) == {"nodeName"} and (ready is None or ready.get("status") != "True"):
        return None
    return {"status": patch}
