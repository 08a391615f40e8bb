"""The pure RBAC evaluator: rule matching, subjects, binding scope, reasons and messages."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.apiserver.auth import Attributes, User
from kubesim.apiserver.rbac import Policy, forbidden_message, rule_allows

GROUP = "rbac.authorization.k8s.io"
SA = User(
    "system:serviceaccount:apps:gw",
    ("system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated"),
)
ALICE = User("alice", ("devs", "system:authenticated"))


def attrs(
    user: User = SA,
    verb: str = "get",
    group: str = "",
    resource: str = "pods",
    subresource: str = "",
    namespace: str = "apps",
    name: str = "",
) -> Attributes:
    return Attributes(user, verb, group, resource, subresource, namespace, name, "/unused")


def role(name: str, rules: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"kind": "Role" if namespace else "ClusterRole", "metadata": meta, "rules": rules}


def binding(name: str, ref_kind: str, ref: str, subjects: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": GROUP, "kind": ref_kind, "name": ref},
        "subjects": subjects,
    }


SA_SUBJECT = {"kind": "ServiceAccount", "name": "gw", "namespace": "apps"}
READ_PODS = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


# ---- one rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "request_", "allowed"),
    [
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, attrs(), True),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, attrs(verb="patch"), False),
        ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, attrs(verb="patch", group="apps"), True),
        ({"apiGroups": ["apps"], "resources": ["pods"], "verbs": ["get"]}, attrs(), False),
        # A subresource is its own resource: "pods" does not grant "pods/status", and vice versa.
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, attrs(subresource="status"), False),
        ({"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]}, attrs(subresource="status"), True),
        ({"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]}, attrs(), False),
        ({"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]}, attrs(subresource="status"), True),
        ({"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]}, attrs(), False),
        ({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}, attrs(subresource="status"), True),
        (
            {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
            attrs(verb="create", resource="serviceaccounts", subresource="token", name="gw"),
            True,
        ),
        # resourceNames pin the object; a create (no name yet) or a list never matches them.
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["a"]}, attrs(name="a"), True),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["a"]}, attrs(name="b"), False),
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"], "resourceNames": ["a"]},
            attrs(verb="create"),
            False,
        ),
        # A resource rule says nothing about non-resource URLs and the other way round.
        ({"nonResourceURLs": ["*"], "verbs": ["*"]}, attrs(), False),
    ],
)
def test_rule_matching(rule: dict[str, Any], request_: Attributes, allowed: bool) -> None:
    assert rule_allows(rule, request_) is allowed


@pytest.mark.parametrize(
    ("urls", "path", "allowed"),
    [
        (["/healthz"], "/healthz", True),
        (["/healthz"], "/healthz/ping", False),
        (["/apis/*"], "/apis/apps/v1", True),
        (["/apis/*"], "/apis", False),
        (["*"], "/anything", True),
    ],
)
def test_non_resource_urls(urls: list[str], path: str, allowed: bool) -> None:
    request = Attributes(SA, "get", path=path)
    assert rule_allows({"nonResourceURLs": urls, "verbs": ["get"]}, request) is allowed
    assert not rule_allows({"nonResourceURLs": urls, "verbs": ["post"]}, request)


# ---- subjects and scope --------------------------------------------------------------------------


def test_role_binding_grants_only_in_its_namespace() -> None:
    policy = Policy.build(
        roles=[role("read", READ_PODS, "apps")],
        role_bindings=[binding("read", "Role", "read", [SA_SUBJECT], "apps")],
    )
    assert policy.decide(attrs()).allowed
    assert not policy.decide(attrs(namespace="other")).allowed
    assert not policy.decide(attrs(namespace="")).allowed  # never cluster-wide
    assert not policy.decide(attrs(verb="patch")).allowed


def test_role_binding_to_a_cluster_role_grants_it_in_the_binding_namespace_only() -> None:
    policy = Policy.build(
        cluster_roles=[role("read", READ_PODS)],
        role_bindings=[binding("read", "ClusterRole", "read", [SA_SUBJECT], "apps")],
    )
    assert policy.decide(attrs()).allowed
    assert not policy.decide(attrs(namespace="kube-system")).allowed
    assert not policy.decide(attrs(verb="list", namespace="")).allowed


def test_cluster_role_binding_grants_everywhere() -> None:
    policy = Policy.build(
        cluster_roles=[role("read", READ_PODS)],
        cluster_role_bindings=[binding("read", "ClusterRole", "read", [SA_SUBJECT])],
    )
    for namespace in ("apps", "other", ""):
        assert policy.decide(attrs(verb="list", namespace=namespace)).allowed


def test_a_role_binding_cannot_use_a_role_of_another_namespace() -> None:
    policy = Policy.build(
        roles=[role("read", READ_PODS, "other")],
        role_bindings=[binding("read", "Role", "read", [SA_SUBJECT], "apps")],
    )
    decision = policy.decide(attrs())
    assert not decision.allowed
    assert decision.reason == f'RBAC: role.{GROUP} "read" not found'


@pytest.mark.parametrize(
    ("subject", "user", "allowed"),
    [
        ({"kind": "User", "apiGroup": GROUP, "name": "alice"}, ALICE, True),
        ({"kind": "User", "apiGroup": GROUP, "name": "alice"}, SA, False),
        ({"kind": "Group", "apiGroup": GROUP, "name": "devs"}, ALICE, True),
        ({"kind": "Group", "apiGroup": GROUP, "name": "system:serviceaccounts:apps"}, SA, True),
        ({"kind": "Group", "apiGroup": GROUP, "name": "system:serviceaccounts:other"}, SA, False),
        (SA_SUBJECT, SA, True),
        ({"kind": "ServiceAccount", "name": "gw", "namespace": "other"}, SA, False),
        # In a RoleBinding a ServiceAccount subject without a namespace is in the binding's.
        ({"kind": "ServiceAccount", "name": "gw"}, SA, True),
        # The SA's username as a User subject is the same identity.
        ({"kind": "User", "apiGroup": GROUP, "name": "system:serviceaccount:apps:gw"}, SA, True),
    ],
)
def test_subjects(subject: dict[str, Any], user: User, allowed: bool) -> None:
    policy = Policy.build(
        roles=[role("read", READ_PODS, "apps")],
        role_bindings=[binding("read", "Role", "read", [subject], "apps")],
    )
    assert policy.decide(attrs(user=user)).allowed is allowed


def test_a_cluster_role_binding_service_account_needs_its_namespace() -> None:
    policy = Policy.build(
        cluster_roles=[role("read", READ_PODS)],
        cluster_role_bindings=[binding("read", "ClusterRole", "read", [{"kind": "ServiceAccount", "name": "gw"}])],
    )
    assert not policy.decide(attrs()).allowed


def test_non_resource_urls_come_only_from_cluster_role_bindings() -> None:
    rules = [{"nonResourceURLs": ["/apis", "/apis/*"], "verbs": ["get"]}]
    group = [{"kind": "Group", "apiGroup": GROUP, "name": "system:authenticated"}]
    policy = Policy.build(
        cluster_roles=[role("discovery", rules)],
        cluster_role_bindings=[binding("discovery", "ClusterRole", "discovery", group)],
    )
    assert policy.decide(Attributes(SA, "get", path="/apis/apps/v1")).allowed
    assert not policy.decide(Attributes(SA, "get", path="/api/v1")).allowed
    assert not policy.decide(Attributes(User("anon", ("system:unauthenticated",)), "get", path="/apis")).allowed


# ---- reasons and messages ------------------------------------------------------------------------


def test_allowed_reason_names_the_binding_as_upstream_does() -> None:
    policy = Policy.build(
        cluster_roles=[role("read", READ_PODS)],
        role_bindings=[binding("read-b", "ClusterRole", "read", [{"kind": "ServiceAccount", "name": "gw"}], "apps")],
        cluster_role_bindings=[],
    )
    assert policy.decide(attrs()).reason == (
        'RBAC: allowed by RoleBinding "read-b/apps" of ClusterRole "read" to ServiceAccount "gw/apps"'
    )
    policy = Policy.build(
        cluster_roles=[role("read", READ_PODS)],
        cluster_role_bindings=[binding("read-c", "ClusterRole", "read", [{"kind": "User", "name": "alice"}])],
    )
    assert policy.decide(attrs(user=ALICE)).reason == (
        'RBAC: allowed by ClusterRoleBinding "read-c" of ClusterRole "read" to User "alice"'
    )


def test_denied_without_errors_has_no_reason_and_missing_roles_are_listed() -> None:
    assert Policy.build().decide(attrs()).reason == ""
    policy = Policy.build(
        cluster_role_bindings=[
            binding("a", "ClusterRole", "gone-a", [SA_SUBJECT]),
            binding("b", "ClusterRole", "gone-b", [SA_SUBJECT]),
        ]
    )
    assert policy.decide(attrs()).reason == (
        f'RBAC: [clusterrole.{GROUP} "gone-a" not found, clusterrole.{GROUP} "gone-b" not found]'
    )


def test_bindings_are_indexed_by_subject() -> None:
    policy = Policy.build(
        cluster_roles=[role("read", READ_PODS)],
        cluster_role_bindings=[
            binding(f"b{i}", "ClusterRole", "read", [{"kind": "User", "apiGroup": GROUP, "name": f"u{i}"}])
            for i in range(1000)
        ],
    )
    # Only the user's own binding is considered, however many there are.
    assert len(policy.grants_for(attrs(user=User("u7", ())))) == 1
    assert policy.grants_for(attrs()) == []


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            attrs(verb="patch", name="p1"),
            'pods "p1" is forbidden: User "system:serviceaccount:apps:gw" cannot patch resource "pods" '
            'in API group "" in the namespace "apps"',
        ),
        (
            attrs(verb="list", group="agents.x-k8s.io", resource="sandboxes", namespace="other"),
            'sandboxes.agents.x-k8s.io is forbidden: User "system:serviceaccount:apps:gw" cannot list resource '
            '"sandboxes" in API group "agents.x-k8s.io" in the namespace "other"',
        ),
        (
            attrs(verb="update", subresource="status", name="p1"),
            'pods "p1" is forbidden: User "system:serviceaccount:apps:gw" cannot update resource "pods/status" '
            'in API group "" in the namespace "apps"',
        ),
        (
            attrs(verb="create", group="authentication.k8s.io", resource="tokenreviews", namespace=""),
            'tokenreviews.authentication.k8s.io is forbidden: User "system:serviceaccount:apps:gw" cannot create '
            'resource "tokenreviews" in API group "authentication.k8s.io" at the cluster scope',
        ),
        (
            Attributes(SA, "get", path="/metrics"),
            'forbidden: User "system:serviceaccount:apps:gw" cannot get path "/metrics"',
        ),
    ],
)
def test_forbidden_messages_are_upstreams(request_: Attributes, message: str) -> None:
    assert forbidden_message(request_) == message


def test_forbidden_message_appends_a_reason() -> None:
    assert forbidden_message(attrs(name="p"), 'RBAC: role.x "r" not found').endswith(
        'in the namespace "apps": RBAC: role.x "r" not found'
    )
