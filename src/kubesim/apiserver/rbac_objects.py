"""The four ``rbac.authorization.k8s.io/v1`` kinds as stored objects: defaulting, validation and
the bootstrap policy a cluster starts with.

Defaulting and validation follow pkg/apis/rbac/v1 and pkg/apis/rbac/validation (the messages
clients print). The bootstrap policy is the part of upstream's that clients rely on: discovery,
``kubectl auth can-i``/``whoami`` for every authenticated user, the public health/version paths,
the service-account issuer discovery documents, and ``cluster-admin`` for ``system:masters``.
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.schema import FieldError

GROUP = "rbac.authorization.k8s.io"
VERSION = "v1"
ROLE_KINDS = {"roles": "Role", "clusterroles": "ClusterRole"}
BINDING_KINDS = {"rolebindings": "RoleBinding", "clusterrolebindings": "ClusterRoleBinding"}
BOOTSTRAP_LABEL = "kubernetes.io/bootstrapping"


def _err(field: str, reason: str, message: str) -> FieldError:
    return {"field": field, "reason": reason, "message": message}


def _go_list(values: list[Any]) -> str:
    # How Go's %v prints a []string in field errors: [a b c].
    return "[" + " ".join(str(v) for v in values) + "]"


def name_errors(name: str) -> list[str]:
    """Upstream's ``ValidateRBACName`` (a valid path segment): colons are fine, slashes are not."""
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


# ---- defaulting ----------------------------------------------------------------------------------


def default(plural: str, obj: dict[str, Any]) -> None:
    """v1 defaults: ``roleRef.apiGroup`` and the subjects' ``apiGroup`` (User/Group)."""
    if plural not in BINDING_KINDS:
        return
    ref = obj.get("roleRef")
    if isinstance(ref, dict) and not ref.get("apiGroup"):
        ref["apiGroup"] = GROUP
    for subject in obj.get("subjects") or ():
        # ServiceAccounts are core objects (group ""); users and groups belong to RBAC's group.
        if isinstance(subject, dict) and not subject.get("apiGroup") and subject.get("kind") in ("User", "Group"):
            subject["apiGroup"] = GROUP


# ---- validation ----------------------------------------------------------------------------------


def _validate_rule(rule: Any, index: int, namespaced: bool) -> list[FieldError]:
    path = f"rules[{index}]"
    if not isinstance(rule, dict):
        return [_err(path, "FieldValueInvalid", "Invalid value: must be an object")]
    errs: list[FieldError] = []
    if not rule.get("verbs"):
        message = "Required value: verbs must contain at least one value"
        errs.append(_err(f"{path}.verbs", "FieldValueRequired", message))
    urls = rule.get("nonResourceURLs") or []
    if urls:
        if namespaced:
            errs.append(
                _err(
                    f"{path}.nonResourceURLs",
                    "FieldValueInvalid",
                    f"Invalid value: {_go_list(urls)}: namespaced rules cannot apply to non-resource URLs",
                )
            )
        if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
            errs.append(
                _err(
                    f"{path}.nonResourceURLs",
                    "FieldValueInvalid",
                    f"Invalid value: {_go_list(urls)}: rules cannot apply to both regular resources and "
                    "non-resource URLs",
                )
            )
        return errs
    if not rule.get("apiGroups"):
        errs.append(
            _err(
                f"{path}.apiGroups",
                "FieldValueRequired",
                "Required value: resource rules must supply at least one api group",
            )
        )
    if not rule.get("resources"):
        errs.append(
            _err(
                f"{path}.resources",
                "FieldValueRequired",
                "Required value: resource rules must supply at least one resource",
            )
        )
    return errs


def _validate_subject(subject: Any, index: int, cluster: bool) -> list[FieldError]:
    path = f"subjects[{index}]"
    if not isinstance(subject, dict):
        return [_err(path, "FieldValueInvalid", "Invalid value: must be an object")]
    errs: list[FieldError] = []
    if not subject.get("name"):
        errs.append(_err(f"{path}.name", "FieldValueRequired", "Required value"))
    kind = subject.get("kind", "")
    group = subject.get("apiGroup", "")
    if kind == "ServiceAccount":
        if group:
            message = f'Unsupported value: "{group}": supported values: ""'
            errs.append(_err(f"{path}.apiGroup", "FieldValueNotSupported", message))
        if cluster and not subject.get("namespace"):
            errs.append(_err(f"{path}.namespace", "FieldValueRequired", "Required value"))
    elif kind in ("User", "Group"):
        if group != GROUP:
            errs.append(
                _err(
                    f"{path}.apiGroup",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{group}": supported values: "{GROUP}"',
                )
            )
    else:
        errs.append(
            _err(
                f"{path}.kind",
                "FieldValueNotSupported",
                f'Unsupported value: "{kind}": supported values: "ServiceAccount", "User", "Group"',
            )
        )
    return errs


def _validate_role_ref(ref: Any, cluster: bool) -> list[FieldError]:
    if not isinstance(ref, dict):
        return [_err("roleRef", "FieldValueRequired", "Required value")]
    errs: list[FieldError] = []
    if ref.get("apiGroup") != GROUP:
        errs.append(
            _err(
                "roleRef.apiGroup",
                "FieldValueNotSupported",
                f'Unsupported value: "{ref.get("apiGroup", "")}": supported values: "{GROUP}"',
            )
        )
    allowed = ("ClusterRole",) if cluster else ("Role", "ClusterRole")
    if ref.get("kind") not in allowed:
        supported = ", ".join(f'"{k}"' for k in allowed)
        errs.append(
            _err(
                "roleRef.kind",
                "FieldValueNotSupported",
                f'Unsupported value: "{ref.get("kind", "")}": supported values: {supported}',
            )
        )
    if not ref.get("name"):
        errs.append(_err("roleRef.name", "FieldValueRequired", "Required value"))
    return errs


def _go_role_ref(ref: Any) -> str:
    ref = ref if isinstance(ref, dict) else {}
    return (
        f'rbac.RoleRef{{APIGroup:"{ref.get("apiGroup", "")}", Kind:"{ref.get("kind", "")}", '
        f'Name:"{ref.get("name", "")}"}}'
    )


def validate(plural: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Field errors for a Role, ClusterRole, RoleBinding or ClusterRoleBinding (empty when valid)."""
    errs: list[FieldError] = []
    if plural in ROLE_KINDS:
        rules = obj.get("rules") or []
        if not isinstance(rules, list):
            return [_err("rules", "FieldValueInvalid", "Invalid value: must be a list")]
        for i, rule in enumerate(rules):
            errs.extend(_validate_rule(rule, i, namespaced=plural == "roles"))
        return errs
    if plural not in BINDING_KINDS:
        return errs
    cluster = plural == "clusterrolebindings"
    ref = obj.get("roleRef")
    if old is not None and ref != old.get("roleRef"):
        # Changing what a binding grants would bypass the bind check; upstream forbids it outright.
        return [_err("roleRef", "FieldValueInvalid", f"Invalid value: {_go_role_ref(ref)}: cannot change roleRef")]
    errs.extend(_validate_role_ref(ref, cluster))
    subjects = obj.get("subjects") or []
    if not isinstance(subjects, list):
        return [*errs, _err("subjects", "FieldValueInvalid", "Invalid value: must be a list")]
    for i, subject in enumerate(subjects):
        errs.extend(_validate_subject(subject, i, cluster))
    return errs


# ---- bootstrap policy ----------------------------------------------------------------------------


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {BOOTSTRAP_LABEL: "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    }


def _cluster_binding(name: str, role: str, groups: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {BOOTSTRAP_LABEL: "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": g} for g in groups],
    }


def bootstrap_policy() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ClusterRoles, ClusterRoleBindings) a fresh RBAC-enabled cluster has, as upstream creates them."""
    roles = [
        _cluster_role(
            "cluster-admin",
            [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        ),
        _cluster_role(
            "system:discovery",
            [
                {
                    "nonResourceURLs": [
                        "/api",
                        "/api/*",
                        "/apis",
                        "/apis/*",
                        "/healthz",
                        "/livez",
                        "/openapi",
                        "/openapi/*",
                        "/readyz",
                        "/version",
                        "/version/",
                    ],
                    "verbs": ["get"],
                }
            ],
        ),
        _cluster_role(
            "system:basic-user",
            [
                {
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    "verbs": ["create"],
                },
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
            ],
        ),
        _cluster_role(
            "system:public-info-viewer",
            [
                {
                    "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
                    "verbs": ["get"],
                }
            ],
        ),
        _cluster_role(
            "system:service-account-issuer-discovery",
            [{"nonResourceURLs": ["/.well-known/openid-configuration", "/openid/v1/jwks"], "verbs": ["get"]}],
        ),
    ]
    bindings = [
        _cluster_binding("cluster-admin", "cluster-admin", ["system:masters"]),
        _cluster_binding("system:discovery", "system:discovery", ["system:authenticated"]),
        _cluster_binding("system:basic-user", "system:basic-user", ["system:authenticated"]),
        _cluster_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            ["system:authenticated", "system:unauthenticated"],
        ),
        _cluster_binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            ["system:serviceaccounts"],
        ),
    ]
    return roles, bindings
