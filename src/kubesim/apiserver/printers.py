"""Table columns of the built-in workload and networking kinds, as kubectl prints them (the
columns of ``kubectl get deploy,rs,pods,svc,endpointslices,pdb [-o wide]``; priority-1 columns are
the ``-o wide`` ones). ``tables`` picks these up; pods' base columns live there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Row = Callable[[Obj], list[Any]]


def _col(name: str, kind: str = "string", priority: int = 0, description: str = "") -> Obj:
    return {
        "name": name,
        "type": kind,
        "format": "name" if name == "Name" else "",
        "description": description,
        "priority": priority,
    }


def _age(obj: Obj) -> str:
    from kubesim.apiserver.tables import age

    return age(obj["metadata"].get("creationTimestamp"))


def _selector(selector: Any) -> str:
    if not isinstance(selector, dict):
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        values = ",".join(expr.get("values") or [])
        op = expr.get("operator")
        parts.append(
            {
                "In": f"{expr['key']} in ({values})",
                "NotIn": f"{expr['key']} notin ({values})",
                "Exists": expr["key"],
            }.get(str(op), f"!{expr['key']}")
        )
    return ",".join(parts) or "<none>"


def _containers(template: Obj) -> tuple[str, str]:
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    return ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)


_WORKLOAD_WIDE = [_col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)]
DEPLOYMENT_COLUMNS = [
    _col("Name"),
    _col("Ready"),
    _col("Up-to-date", "integer"),
    _col("Available", "integer"),
    _col("Age"),
    *_WORKLOAD_WIDE,
]


def deployment_row(d: Obj) -> list[Any]:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    names, images = _containers(spec.get("template") or {})
    return [
        d["metadata"]["name"],
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        _age(d),
        names,
        images,
        _selector(spec.get("selector")),
    ]


REPLICASET_COLUMNS = [
    _col("Name"),
    _col("Desired", "integer"),
    _col("Current", "integer"),
    _col("Ready", "integer"),
    _col("Age"),
    *_WORKLOAD_WIDE,
]


def replicaset_row(rs: Obj) -> list[Any]:
    spec, status = rs.get("spec") or {}, rs.get("status") or {}
    names, images = _containers(spec.get("template") or {})
    return [
        rs["metadata"]["name"],
        spec.get("replicas", 1),
        status.get("replicas", 0),
        status.get("readyReplicas", 0),
        _age(rs),
        names,
        images,
        _selector(spec.get("selector")),
    ]


SERVICE_COLUMNS = [
    _col("Name"),
    _col("Type"),
    _col("Cluster-IP"),
    _col("External-IP"),
    _col("Port(s)"),
    _col("Age"),
    _col("Selector", priority=1),
]


def _ports(svc: Obj) -> str:
    out = []
    for p in (svc.get("spec") or {}).get("ports") or []:
        text = f"{p.get('port')}"
        if p.get("nodePort"):
            text += f":{p['nodePort']}"
        out.append(f"{text}/{p.get('protocol', 'TCP')}")
    return ",".join(out) or "<none>"


def _external(svc: Obj) -> str:
    spec = svc.get("spec") or {}
    if spec.get("externalIPs"):
        return ",".join(spec["externalIPs"])
    ingress = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    if spec.get("type") == "LoadBalancer":
        return ",".join(i.get("ip") or i.get("hostname", "") for i in ingress) or "<pending>"
    if spec.get("type") == "ExternalName":
        return str(spec.get("externalName", ""))
    return "<none>"


def service_row(svc: Obj) -> list[Any]:
    spec = svc.get("spec") or {}
    selector = spec.get("selector")
    return [
        svc["metadata"]["name"],
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP") or "<none>",
        _external(svc),
        _ports(svc),
        _age(svc),
        ",".join(f"{k}={v}" for k, v in sorted(selector.items())) if selector else "<none>",
    ]


ENDPOINTSLICE_COLUMNS = [_col("Name"), _col("AddressType"), _col("Ports"), _col("Endpoints"), _col("Age")]


def endpointslice_row(s: Obj) -> list[Any]:
    ports = ",".join(str(p.get("port")) for p in s.get("ports") or []) or "<unset>"
    addresses = [a for e in s.get("endpoints") or [] for a in e.get("addresses") or []]
    shown = ",".join(addresses[:3]) + (f" + {len(addresses) - 3} more..." if len(addresses) > 3 else "")
    return [s["metadata"]["name"], s.get("addressType", ""), ports, shown or "<unset>", _age(s)]


PDB_COLUMNS = [
    _col("Name"),
    _col("Min Available"),
    _col("Max Unavailable"),
    _col("Allowed Disruptions", "integer"),
    _col("Age"),
]


def pdb_row(pdb: Obj) -> list[Any]:
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    return [
        pdb["metadata"]["name"],
        str(spec.get("minAvailable", "N/A")),
        str(spec.get("maxUnavailable", "N/A")),
        status.get("disruptionsAllowed", 0),
        _age(pdb),
    ]


POD_WIDE_COLUMNS = [
    _col("IP", priority=1),
    _col("Node", priority=1),
    _col("Nominated Node", priority=1),
    _col("Readiness Gates", priority=1),
]


def pod_wide_cells(pod: Obj) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    gates = spec.get("readinessGates") or []
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        ready = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        gate_text = f"{ready}/{len(gates)}"
    else:
        gate_text = "<none>"
    return [
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gate_text,
    ]


BUILTIN: dict[tuple[str, str], tuple[list[Obj], Row]] = {
    ("apps", "deployments"): (DEPLOYMENT_COLUMNS, deployment_row),
    ("apps", "replicasets"): (REPLICASET_COLUMNS, replicaset_row),
    ("", "services"): (SERVICE_COLUMNS, service_row),
    ("discovery.k8s.io", "endpointslices"): (ENDPOINTSLICE_COLUMNS, endpointslice_row),
    ("policy", "poddisruptionbudgets"): (PDB_COLUMNS, pdb_row),
}
