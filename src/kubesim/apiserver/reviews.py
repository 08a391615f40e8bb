"""Who-am-I and may-I reviews, answered by the same ``Authorizer`` that guards every request.

``kubectl auth whoami`` (SelfSubjectReview), ``kubectl auth can-i`` (SelfSubjectAccessReview) and
``kubectl auth can-i --list`` (SelfSubjectRulesReview), plus SubjectAccessReview for asking about
someone else. With the default ``AllowAll`` authorizer
every review is allowed; an RBAC authorizer changes the answers without touching this module.
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver import errors
from kubesim.apiserver.auth import Attributes, Authorizer, User


def _user_info(user: User) -> dict[str, Any]:
    info: dict[str, Any] = {"username": user.username, "groups": list(user.groups)}
    if user.uid:
        info["uid"] = user.uid
    if user.extra:
        info["extra"] = user.extra
    return info


def self_subject_review(user: User) -> dict[str, Any]:
    """POST selfsubjectreviews: the caller's own identity."""
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "status": {"userInfo": _user_info(user)},
    }


def access_review(authorizer: Authorizer, body: Any, caller: User, *, self_review: bool) -> dict[str, Any]:
    """POST (self)subjectaccessreviews: run the authorizer on the described request."""
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be an access review")
    spec = body.get("spec") or {}
    if self_review:
        user = caller
    else:
        user = User(
            spec.get("user", ""), tuple(spec.get("groups") or ()), spec.get("uid", ""), dict(spec.get("extra") or {})
        )
    ra = spec.get("resourceAttributes")
    nra = spec.get("nonResourceAttributes")
    if ra:
        attrs = Attributes(
            user,
            ra.get("verb", ""),
            ra.get("group", ""),
            ra.get("resource", ""),
            ra.get("subresource", ""),
            ra.get("namespace", ""),
            ra.get("name", ""),
        )
    elif nra:
        attrs = Attributes(user, nra.get("verb", ""), path=nra.get("path", ""))
    else:
        raise errors.ApiError(
            422,
            "Invalid",
            f'{body.get("kind", "SubjectAccessReview")}.authorization.k8s.io "" is invalid: '
            'spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or '
            "resourceAttributes must be specified",
        )
    # An authorizer that can explain itself (RBAC) also says why a request is allowed, as upstream's
    # "RBAC: allowed by ClusterRoleBinding ..." reasons do.
    decide = getattr(authorizer, "decide", None)
    if callable(decide):
        decision = decide(attrs)
        allowed, reason = bool(decision.allowed), str(decision.reason)
    else:
        denied = authorizer.authorize(attrs)
        allowed, reason = denied is None, denied or ""
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return {
        "kind": body.get("kind") or ("SelfSubjectAccessReview" if self_review else "SubjectAccessReview"),
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }


_EVERYTHING = [{"nonResourceURLs": ["*"], "verbs": ["*"]}, {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]


def self_subject_rules_review(authorizer: Authorizer, body: Any, caller: User) -> dict[str, Any]:
    """POST selfsubjectrulesreviews (``kubectl auth can-i --list``): the caller's rules in a namespace.

    An authorizer that knows rules (RBAC) lists them; any other one allows everything, so says so.
    """
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a SelfSubjectRulesReview")
    spec = body.get("spec") or {}
    rules_for = getattr(authorizer, "rules_for", None)
    rules = rules_for(caller, spec.get("namespace", "")) if callable(rules_for) else _EVERYTHING
    resource_rules: list[dict[str, Any]] = []
    non_resource_rules: list[dict[str, Any]] = []
    for rule in rules:
        if rule.get("nonResourceURLs"):
            non_resource_rules.append({"verbs": list(rule["verbs"]), "nonResourceURLs": list(rule["nonResourceURLs"])})
        else:
            entry = {k: list(rule.get(k) or []) for k in ("verbs", "apiGroups", "resources", "resourceNames")}
            resource_rules.append({k: v for k, v in entry.items() if v or k == "verbs"})
    return {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": False},
    }
