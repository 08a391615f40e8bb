"""Verbs that compute rather than store: TokenRequest, TokenReview and pod Binding."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from kubesim.apiserver import errors, meta, tokens
from kubesim.apiserver.auth import Authenticator
from kubesim.apiserver.rest import Rest

MIN_EXPIRATION = 600


def live_uid(rest: Rest) -> tokens.Validator:
    """A validator that reports the uid of a live, not-yet-deleted ServiceAccount or Pod."""

    def validate(kind: str, namespace: str, name: str) -> str | None:
        plural = "serviceaccounts" if kind == "ServiceAccount" else "pods"
        found = rest.store.get("", plural, namespace, name)
        if found is None:
            return None
        deleting = found.obj["metadata"].get("deletionTimestamp")
        if kind == "Pod" and deleting and deleting <= meta.now():
            return None
        return str(found.obj["metadata"]["uid"])

    return validate


def token_request(
    rest: Rest, issuer: tokens.TokenIssuer, api_audiences: list[str], ns: str, sa_name: str, body: Any
) -> dict[str, Any]:
    """POST serviceaccounts/<name>/token."""
    sa = rest.store.get("", "serviceaccounts", ns, sa_name)
    if sa is None:
        raise errors.not_found("serviceaccounts", "", sa_name)
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a TokenRequest")
    spec = dict(body.get("spec") or {})
    audiences = list(spec.get("audiences") or api_audiences)
    expiration = int(spec.get("expirationSeconds") or 3600)
    if expiration < MIN_EXPIRATION:
        raise errors.invalid(
            "TokenRequest",
            "authentication.k8s.io",
            sa_name,
            [
                {
                    "field": "spec.expirationSeconds",
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {expiration}: may not specify a duration less than 10 minutes",
                }
            ],
        )
    pod: tuple[str, str] | None = None
    ref = spec.get("boundObjectRef")
    if ref:
        if ref.get("kind") != "Pod":
            raise errors.invalid(
                "TokenRequest",
                "authentication.k8s.io",
                sa_name,
                [
                    {
                        "field": "spec.boundObjectRef.kind",
                        "reason": "FieldValueNotSupported",
                        "message": f'Unsupported value: "{ref.get("kind")}": supported values: "Pod"',
                    }
                ],
            )
        found = rest.store.get("", "pods", ns, ref.get("name", ""))
        if found is None:
            raise errors.not_found("pods", "", ref.get("name", ""))
        uid = found.obj["metadata"]["uid"]
        if ref.get("uid") and ref["uid"] != uid:
            raise errors.conflict(
                "pods",
                "",
                ref.get("name", ""),
                f"the UID in the bound object reference ({ref['uid']}) does not match the UID in record. "
                "The object might have been deleted and then recreated",
            )
        pod = (ref["name"], uid)
        spec["boundObjectRef"] = {**ref, "uid": uid}
    token, exp = issuer.issue(
        namespace=ns,
        service_account=sa_name,
        sa_uid=sa.obj["metadata"]["uid"],
        audiences=audiences,
        expiration_seconds=expiration,
        pod=pod,
    )
    spec["audiences"] = audiences
    spec["expirationSeconds"] = expiration
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa_name, "namespace": ns, "creationTimestamp": meta.now()},
        "spec": spec,
        "status": {
            "token": token,
            "expirationTimestamp": datetime.fromtimestamp(exp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }


def token_review(authn: Authenticator, body: Any) -> dict[str, Any]:
    """POST tokenreviews: authenticate ``spec.token`` for ``spec.audiences`` (or the API's)."""
    if not isinstance(body, dict):
        raise errors.bad_request("the body of the request must be a TokenReview")
    spec = body.get("spec") or {}
    token = spec.get("token", "")
    audiences = list(spec.get("audiences") or [])
    review: dict[str, Any] = {
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None, **(body.get("metadata") or {})},
        "spec": copy.deepcopy(spec),
    }
    static = authn.static.get(token)
    if static is not None:
        wanted = audiences or authn.api_audiences
        if not any(a in authn.api_audiences for a in wanted):
            review["status"] = {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
            return review
        review["status"] = {
            "authenticated": True,
            "user": {"username": static.username, "uid": static.uid, "groups": list(static.groups)},
            "audiences": wanted,
        }
        return review
    try:
        verified = authn.issuer.verify(token, audiences or authn.api_audiences, authn.sa_validator)
    except tokens.TokenInvalid as exc:
        review["status"] = {"user": {}, "error": f"[{exc}]"}
        return review
    review["status"] = {
        "authenticated": True,
        "user": {
            "username": verified.username,
            "uid": verified.uid,
            "groups": verified.groups,
            "extra": verified.extra,
        },
        "audiences": verified.audiences,
    }
    return review


def bind(rest: Rest, ns: str, name: str, body: Any) -> dict[str, Any]:
    """POST pods/<name>/binding: what a scheduler does."""
    rt = rest.registry.get("", "pods")
    assert rt is not None
    cur = rest.get(rt, ns, name)
    target = (body or {}).get("target") or {}
    node = target.get("name")
    if not node:
        raise errors.invalid(
            "Binding", "", name, [{"field": "target.name", "reason": "FieldValueRequired", "message": "Required value"}]
        )
    current = (cur.obj.get("spec") or {}).get("nodeName")
    if current:
        raise errors.conflict("pods", "", name, f'pod {name} is already assigned to node "{current}"')
    new = cur.copy()
    new["spec"]["nodeName"] = node
    conditions = [c for c in new.setdefault("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append(
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": meta.now()}
    )
    new["status"]["conditions"] = conditions
    new["metadata"]["resourceVersion"] = str(rest.store.next_rv())
    # A node name and a PodScheduled condition are what the pod's definition declares: what
    # admitted the bound pod admits this one, so the kubelet's first status write need not walk
    # the whole pod again (~40 % of a warm claim's pruning walk before).
    rest.store.put("", "pods", new, cur).admitted_by = cur.admitted_by
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
