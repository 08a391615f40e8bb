"""Who-am-I and may-I reviews, answered by the same ``Authorizer`` that guards every request.

``kubectl auth whoami`` (SelfSubjectReview) and ``kubectl auth can-i`` (SelfSubjectAccessReview),
plus SubjectAccessReview for asking about someone else. With the default ``AllowAll`` authorizer
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
