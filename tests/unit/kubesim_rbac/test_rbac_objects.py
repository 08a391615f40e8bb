"""RBAC objects in the store: defaulting, validation, the bootstrap policy and the authorizer's
cached policy (rebuilt only when an RBAC object changes)."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.apiserver import errors
from kubesim.apiserver.auth import Attributes, User
from kubesim.apiserver.rbac_authorizer import RbacAuthorizer, install_bootstrap_policy
from kubesim.apiserver.resources import Registry
from kubesim.apiserver.rest import Rest, WriteOptions
from kubesim.apiserver.store import Store

GROUP = "rbac.authorization.k8s.io"
SA = User("system:serviceaccount:apps:gw", ("system:serviceaccounts", "system:serviceaccounts:apps"))


@pytest.fixture
def rest() -> Rest:
    rest = Rest(Store(), Registry())
    ns = rest.registry.get("", "namespaces")
    assert ns is not None
    for name in ("apps", "other"):
        rest.create(ns, "v1", "", {"metadata": {"name": name}}, WriteOptions())
    return rest


def create(rest: Rest, plural: str, body: dict[str, Any], namespace: str = "") -> dict[str, Any]:
    rt = rest.registry.get(GROUP, plural)
    assert rt is not None
    return rest.create(rt, "v1", namespace, body, WriteOptions()).obj


def invalid(rest: Rest, plural: str, body: dict[str, Any], namespace: str = "") -> str:
    with pytest.raises(errors.ApiError) as caught:
        create(rest, plural, body, namespace)
    assert caught.value.code == 422
    return caught.value.message


def test_the_four_kinds_are_served_with_upstream_scope() -> None:
    registry = Registry()
    for plural, namespaced in (
        ("roles", True),
        ("rolebindings", True),
        ("clusterroles", False),
        ("clusterrolebindings", False),
    ):
        rt = registry.get(GROUP, plural)
        assert rt is not None
        assert rt.namespaced is namespaced
        assert set(rt.verbs) >= {"create", "get", "list", "watch", "update", "patch", "delete"}


def test_binding_defaults(rest: Rest) -> None:
    stored = create(
        rest,
        "rolebindings",
        {
            "metadata": {"name": "b"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "gw"}],
        },
        "apps",
    )
    assert stored["roleRef"]["apiGroup"] == GROUP
    assert stored["subjects"][0]["apiGroup"] == GROUP
    assert "apiGroup" not in stored["subjects"][1]


def test_rule_validation(rest: Rest) -> None:
    message = invalid(
        rest, "roles", {"metadata": {"name": "r"}, "rules": [{"resources": ["pods"], "verbs": []}]}, "apps"
    )
    assert message == (
        'Role.rbac.authorization.k8s.io "r" is invalid: [rules[0].verbs: Required value: verbs must contain at '
        "least one value, rules[0].apiGroups: Required value: resource rules must supply at least one api group]"
    )
    message = invalid(
        rest, "roles", {"metadata": {"name": "r"}, "rules": [{"nonResourceURLs": ["/x"], "verbs": ["get"]}]}, "apps"
    )
    assert "namespaced rules cannot apply to non-resource URLs" in message
    create(rest, "clusterroles", {"metadata": {"name": "c"}, "rules": [{"nonResourceURLs": ["/x"], "verbs": ["get"]}]})


def test_binding_validation(rest: Rest) -> None:
    message = invalid(
        rest,
        "clusterrolebindings",
        {
            "metadata": {"name": "b"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "gw"}, {"kind": "Robot", "name": "x"}],
        },
    )
    assert 'roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"' in message
    assert "subjects[0].namespace: Required value" in message
    assert 'subjects[1].kind: Unsupported value: "Robot"' in message


def test_role_ref_is_immutable(rest: Rest) -> None:
    body = {"metadata": {"name": "b"}, "roleRef": {"kind": "Role", "name": "r"}, "subjects": []}
    stored = create(rest, "rolebindings", body, "apps")
    rt = rest.registry.get(GROUP, "rolebindings")
    assert rt is not None
    changed = {**stored, "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "admin"}}
    with pytest.raises(errors.ApiError) as caught:
        rest.update(rt, "v1", "apps", "b", changed, WriteOptions())
    assert caught.value.message == (
        'RoleBinding.rbac.authorization.k8s.io "b" is invalid: roleRef: Invalid value: '
        'rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"Role", Name:"admin"}: cannot change roleRef'
    )
    # Subjects may change.
    rest.update(rt, "v1", "apps", "b", {**stored, "subjects": [{"kind": "User", "name": "bob"}]}, WriteOptions())


def test_bootstrap_policy_lets_everyone_discover_and_ask(rest: Rest) -> None:
    authz = RbacAuthorizer(rest.store)
    install_bootstrap_policy(rest, rest.registry)
    install_bootstrap_policy(rest, rest.registry)  # idempotent
    user = User("someone", ("system:authenticated",))
    assert authz.decide(Attributes(user, "get", path="/apis")).allowed
    assert authz.decide(Attributes(user, "create", "authorization.k8s.io", "selfsubjectaccessreviews")).allowed
    assert not authz.decide(Attributes(user, "list", "", "pods", namespace="apps")).allowed
    anonymous = User("system:anonymous", ("system:unauthenticated",))
    assert authz.decide(Attributes(anonymous, "get", path="/version")).allowed
    assert not authz.decide(Attributes(anonymous, "get", path="/apis")).allowed
    assert authz.decide(Attributes(SA, "get", path="/openid/v1/jwks")).allowed


def test_masters_bypass_rbac(rest: Rest) -> None:
    authz = RbacAuthorizer(rest.store)
    admin = User("kubesim-admin", ("system:masters", "system:authenticated"))
    assert authz.authorize(Attributes(admin, "patch", "", "pods", namespace="apps", name="p")) is None
    assert authz.authorize(Attributes(SA, "patch", "", "pods", namespace="apps", name="p")) == ""


def test_policy_is_rebuilt_only_after_rbac_writes(rest: Rest) -> None:
    authz = RbacAuthorizer(rest.store)
    read = Attributes(SA, "get", "", "pods", namespace="apps", name="p")
    assert not authz.decide(read).allowed
    assert authz.rebuilds == 1
    create(
        rest,
        "roles",
        {"metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        "apps",
    )
    body = {
        "metadata": {"name": "b"},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "gw"}],
    }
    create(rest, "rolebindings", body, "apps")
    cm = rest.registry.get("", "configmaps")
    assert cm is not None
    rest.create(cm, "v1", "apps", {"metadata": {"name": "c"}}, WriteOptions())  # not RBAC: no rebuild
    for _ in range(100):
        assert authz.decide(read).allowed
    assert authz.rebuilds == 2
    binding = rest.store.get(GROUP, "rolebindings", "apps", "b")
    assert binding is not None
    rest.store.delete(GROUP, "rolebindings", binding)
    assert not authz.decide(read).allowed
    assert authz.rebuilds == 3
