"""Server-side printing: ``meta.k8s.io/v1 Table`` answers for clients that ask for them.

kubectl asks every ``get`` for a Table. For custom resources the columns come from the CRD's
``additionalPrinterColumns`` (evaluated with the simple JSONPath subset CRDs allow, dates rendered as
ages like ``duration.HumanDuration``); pods get the familiar READY/STATUS/RESTARTS/AGE (and the
wide IP/NODE columns), the workload and networking kinds theirs (``printers``). Other kinds are
answered as plain lists, which kubectl prints as NAME/AGE itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubesim.apiserver import printers
from kubesim.apiserver.resources import ResourceType

NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name automatically.",
    "priority": 0,
}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_SEGMENT = re.compile(r"\.([A-Za-z0-9_-]+)|\[\?\(@\.([A-Za-z0-9_]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]|\[(\d+)\]")

Row = Callable[[dict[str, Any]], list[Any]]


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a meta.k8s.io Table first."""
    first = accept.split(",")[0]
    return "as=Table" in first and "g=meta.k8s.io" in first


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d" if hours % 24 == 0 else f"{days}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years, rest = divmod(days, 365)
    if hours < 24 * 365 * 8 and rest:
        return f"{years}y{rest}d"
    return f"{years}y"


def age(timestamp: Any) -> str:
    """Render an RFC 3339 timestamp as an age."""
    if not isinstance(timestamp, str):
        return "<unknown>"
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<invalid>"
    return human_duration((datetime.now(UTC) - then).total_seconds())


def json_path(obj: Any, path: str) -> Any:
    """The first value of a simple JSONPath (``.a.b``, ``[0]``, ``[?(@.k=='v')]``), or None."""
    cur = obj
    for m in _SEGMENT.finditer(path):
        field, key, value, index = m.groups()
        if field is not None:
            cur = cur.get(field) if isinstance(cur, dict) else None
        elif index is not None:
            cur = cur[int(index)] if isinstance(cur, list) and int(index) < len(cur) else None
        else:
            matches = [x for x in cur or [] if isinstance(x, dict) and str(x.get(key)) == value]
            cur = matches[0] if matches else None
        if cur is None:
            return None
    return cur


def _cell(column: dict[str, Any], obj: dict[str, Any]) -> Any:
    value = json_path(obj, column.get("jsonPath", ""))
    if value is None:
        return None
    kind = column.get("type", "string")
    if kind == "date":
        return age(value)
    if kind == "string":
        return value if isinstance(value, str) else str(value)
    return value


def _custom(columns: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Row]:
    columns = columns or [_AGE]
    definitions = [NAME_COLUMN] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]
    return definitions, lambda obj: [obj["metadata"]["name"], *(_cell(c, obj) for c in columns)]


def _pod_row(pod: dict[str, Any]) -> list[Any]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = status.get("reason") or status.get("phase") or "Unknown"
    for s in statuses:
        waiting = (s.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            phase = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        phase = "Terminating"
    total = len(spec.get("containers") or [])
    created = age(pod["metadata"].get("creationTimestamp"))
    return [pod["metadata"]["name"], f"{ready}/{total}", phase, restarts, created, *printers.pod_wide_cells(pod)]


_POD_COLUMNS = [
    NAME_COLUMN,
    {
        "name": "Ready",
        "type": "string",
        "format": "",
        "description": "The aggregate readiness state of this pod for accepting traffic.",
        "priority": 0,
    },
    {
        "name": "Status",
        "type": "string",
        "format": "",
        "description": "The aggregate status of the containers in this pod.",
        "priority": 0,
    },
    {
        "name": "Restarts",
        "type": "integer",
        "format": "",
        "description": "The number of times the containers in this pod have been restarted.",
        "priority": 0,
    },
    {
        "name": "Age",
        "type": "string",
        "format": "",
        "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
        "priority": 0,
    },
]


def printer(rt: ResourceType, version: str) -> tuple[list[dict[str, Any]], Row] | None:
    """Column definitions and a row function for this resource, or None to answer a plain list."""
    if rt.custom:
        info = rt.versions.get(version)
        return _custom(info.printer_columns if info else [])
    if rt.key == ("", "pods"):
        return [*_POD_COLUMNS, *printers.POD_WIDE_COLUMNS], _pod_row
    return printers.BUILTIN.get(rt.key)


def row(obj: dict[str, Any], cells: list[Any], include: str) -> dict[str, Any]:
    """One Table row; ``include`` is the ``includeObject`` option (None, Metadata or Object)."""
    out: dict[str, Any] = {"cells": cells}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
    return out


def table(columns: list[dict[str, Any]], rows: list[dict[str, Any]], list_meta: dict[str, Any]) -> dict[str, Any]:
    """The Table object."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns,
        "rows": rows,
    }
