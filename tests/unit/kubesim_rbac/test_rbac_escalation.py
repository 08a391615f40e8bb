"""Escalation prevention: nobody creates a role or binding that grants more than they hold."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kubesim.apiserver import errors
from kubesim.apiserver.auth import CURRENT_USER, User
from kubesim.apiserver.rbac import compact, escalation_error, rule_covers, uncovered
from kubesim.apiserver.rbac_authorizer import RbacAuthorizer
from kubesim.apiserver.resources import Registry
from kubesim.apiserver.rest import Rest, WriteOptions
from kubesim.apiserver.store import Store

GROUP = "rbac.authorization.k8s.io"
DELEGATE = User("system:serviceaccount:apps:delegate", ("system:serviceaccounts", "system:authenticated"))
READ_PODS = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
MANAGE_RBAC = {"apiGroups": [GROUP], "resources": ["roles", "rolebindings"], "verbs": ["create", "update"]}


@pytest.mark.parametrize(
    ("owner", "wanted", "covered"),
    [
        (READ_PODS, {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, True),
        (READ_PODS, {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}, False),
        (READ_PODS, {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["a"]}, True),
        ({**READ_PODS, "resourceNames": ["a"]}, {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, False),
        ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {**READ_PODS, "verbs": ["delete"]}, True),
        (
            {"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]},
            {**READ_PODS, "resources": ["pods/status"], "verbs": ["get"]},
            True,
        ),
        ({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]}, {"nonResourceURLs": ["/apis/x"], "verbs": ["get"]}, True),
        ({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]}, {"nonResourceURLs": ["/api"], "verbs": ["get"]}, False),
    ],
)
def test_rule_covers(owner: dict[str, Any], wanted: dict[str, Any], covered: bool) -> None:
    assert rule_covers(owner, wanted) is covered


def test_uncovered_parts_are_compacted_and_described_as_upstream() -> None:
    wanted = [{"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["get", "patch", "delete"]}]
    missing = uncovered([READ_PODS], wanted)
    assert len(missing) == 5  # pods patch/delete, secrets get/patch/delete
    assert sorted(len(r["verbs"]) for r in compact(missing)) == [2, 3]
    assert escalation_error(DELEGATE, missing, []) == (
        'user "system:serviceaccount:apps:delegate" (groups=["system:serviceaccounts" "system:authenticated"]) '
        "is attempting to grant RBAC permissions not currently held:\n"
        '{APIGroups:[""], Resources:["pods"], Verbs:["patch" "delete"]}\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "patch" "delete"]}'
    )


@pytest.fixture
def rest() -> Iterator[Rest]:
    rest = Rest(Store(), Registry())
    authz = RbacAuthorizer(rest.store)
    rest.admission.append(authz.admit)
    ns = rest.registry.get("", "namespaces")
    assert ns is not None
    rest.create(ns, "v1", "", {"metadata": {"name": "apps"}}, WriteOptions())
    # Set up as the server itself (no current user): the delegate may manage RBAC and read pods.
    create(rest, "roles", {"metadata": {"name": "delegate"}, "rules": [READ_PODS, MANAGE_RBAC]}, "apps")
    subject = {"kind": "ServiceAccount", "name": "delegate", "namespace": "apps"}
    binding = {"metadata": {"name": "delegate"}, "roleRef": {"kind": "Role", "name": "delegate"}, "subjects": [subject]}
    create(rest, "rolebindings", binding, "apps")
    create(
        rest,
        "clusterroles",
        {"metadata": {"name": "admin"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
    )
    token = CURRENT_USER.set(DELEGATE)
    try:
        yield rest
    finally:
        CURRENT_USER.reset(token)


def create(rest: Rest, plural: str, body: dict[str, Any], namespace: str = "") -> dict[str, Any]:
    rt = rest.registry.get(GROUP, plural)
    assert rt is not None
    return rest.create(rt, "v1", namespace, body, WriteOptions()).obj


def refused(rest: Rest, plural: str, body: dict[str, Any]) -> str:
    with pytest.raises(errors.ApiError) as caught:
        create(rest, plural, body, "apps")
    assert caught.value.code == 403
    assert caught.value.reason == "Forbidden"
    return caught.value.message


def test_a_role_within_the_writers_rights_is_created(rest: Rest) -> None:
    create(rest, "roles", {"metadata": {"name": "reader"}, "rules": [{**READ_PODS, "verbs": ["get"]}]}, "apps")


def test_a_role_beyond_the_writers_rights_is_refused(rest: Rest) -> None:
    message = refused(rest, "roles", {"metadata": {"name": "patcher"}, "rules": [{**READ_PODS, "verbs": ["patch"]}]})
    assert message.startswith(
        'roles.rbac.authorization.k8s.io "patcher" is forbidden: user "system:serviceaccount:apps:delegate" '
    )
    assert message.endswith('not currently held:\n{APIGroups:[""], Resources:["pods"], Verbs:["patch"]}')


def test_binding_a_role_beyond_the_writers_rights_is_refused(rest: Rest) -> None:
    subject = {"kind": "User", "name": "eve"}
    message = refused(
        rest,
        "rolebindings",
        {"metadata": {"name": "eve"}, "roleRef": {"kind": "ClusterRole", "name": "admin"}, "subjects": [subject]},
    )
    assert 'rolebindings.rbac.authorization.k8s.io "eve" is forbidden' in message
    assert '{APIGroups:["*"], Resources:["*"], Verbs:["*"]}' in message
    # Binding a role one holds entirely is fine.
    create(
        rest,
        "rolebindings",
        {"metadata": {"name": "eve"}, "roleRef": {"kind": "Role", "name": "delegate"}, "subjects": [subject]},
        "apps",
    )


def test_escalate_and_bind_verbs_lift_the_check(rest: Rest) -> None:
    CURRENT_USER.set(None)  # the server itself grants the extra verbs
    rules = [
        {"apiGroups": [GROUP], "resources": ["roles"], "verbs": ["escalate"]},
        {"apiGroups": [GROUP], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["admin"]},
    ]
    create(rest, "roles", {"metadata": {"name": "power"}, "rules": rules}, "apps")
    subject = {"kind": "ServiceAccount", "name": "delegate", "namespace": "apps"}
    body = {"metadata": {"name": "power"}, "roleRef": {"kind": "Role", "name": "power"}, "subjects": [subject]}
    create(rest, "rolebindings", body, "apps")
    CURRENT_USER.set(DELEGATE)
    create(rest, "roles", {"metadata": {"name": "patcher"}, "rules": [{**READ_PODS, "verbs": ["patch"]}]}, "apps")
    body = {"metadata": {"name": "eve"}, "roleRef": {"kind": "ClusterRole", "name": "admin"}, "subjects": []}
    create(rest, "rolebindings", body, "apps")
