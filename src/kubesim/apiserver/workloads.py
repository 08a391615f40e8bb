"""Defaulting and validation of the ``apps/v1`` workload kinds kubesim serves: Deployments and
ReplicaSets (their pod templates get the PodSpec defaults in ``builtins``).

Only what clients and the controllers rely on: replicas, the rollout strategy with its 25 %
surge/unavailability, history and progress-deadline defaults, a required selector that matches the
template's labels and stays unchanged (apps/v1 selectors are immutable).
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.schema import FieldError

GROUP = "apps"


def _err(field: str, reason: str, message: str) -> FieldError:
    return {"field": field, "reason": reason, "message": message}


def default(plural: str, obj: dict[str, Any]) -> None:
    """Fill the apps/v1 defaults of a Deployment or ReplicaSet (create and update)."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    if plural == "deployments":
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxSurge", "25%")
            rolling.setdefault("maxUnavailable", "25%")


def _go_map(labels: dict[str, Any]) -> str:
    inner = ", ".join(f'"{k}":"{v}"' for k, v in sorted(labels.items()))
    return f"map[string]string{{{inner}}}"


def _matches(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and (not present or labels[key] not in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def validate(plural: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Field errors of a Deployment or ReplicaSet, in upstream's wording."""
    if plural not in ("deployments", "replicasets"):
        return []
    spec = obj.get("spec") or {}
    errs: list[FieldError] = []
    selector = spec.get("selector")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        errs.append(_err("spec.selector", "FieldValueRequired", "Required value"))
    elif not _matches(selector, labels):
        errs.append(
            _err(
                "spec.template.metadata.labels",
                "FieldValueInvalid",
                f"Invalid value: {_go_map(labels)}: `selector` does not match template `labels`",
            )
        )
    if not ((spec.get("template") or {}).get("spec") or {}).get("containers"):
        errs.append(_err("spec.template.spec.containers", "FieldValueRequired", "Required value"))
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and replicas < 0:
        errs.append(
            _err("spec.replicas", "FieldValueInvalid", f"Invalid value: {replicas}: must be greater than or equal to 0")
        )
    strategy = spec.get("strategy") or {}
    if plural == "deployments" and strategy.get("type") not in (None, "RollingUpdate", "Recreate"):
        errs.append(
            _err(
                "spec.strategy.type",
                "FieldValueNotSupported",
                f'Unsupported value: "{strategy.get("type")}": supported values: "Recreate", "RollingUpdate"',
            )
        )
    if plural == "deployments" and strategy.get("type") == "Recreate" and strategy.get("rollingUpdate"):
        errs.append(
            _err(
                "spec.strategy.rollingUpdate",
                "FieldValueForbidden",
                "Forbidden: may not be specified when strategy `type` is 'Recreate'",
            )
        )
    if old is not None:
        old_selector = (old.get("spec") or {}).get("selector")
        if selector != old_selector:
            errs.append(
                _err("spec.selector", "FieldValueInvalid", f"Invalid value: {_describe(selector)}: field is immutable")
            )
    return errs


def _describe(selector: Any) -> str:
    if not isinstance(selector, dict):
        return "null"
    return f"v1.LabelSelector{{MatchLabels:{_go_map(selector.get('matchLabels') or {})}, MatchExpressions:[]}}"
