"""The RBAC the chart grants, rule by rule, for every combination of the two warm-pooling toggles:
exactly what each feature uses, namespaced wherever Kubernetes allows, and never `patch pods`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.chart.rendering import RELEASE_NAMESPACE, TOGGLES, Manifests, render

SANDBOX_NAMESPACE = "sandboxes"
FULLNAME = "ws-warmshell"
GATEWAY_SA = FULLNAME
LEASE = f"{FULLNAME}-leader"
EXTENSIONS = "extensions.agents.x-k8s.io"


@dataclass(frozen=True)
class Rule:
    """One PolicyRule, order-insensitive."""

    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Rule:
        assert set(raw) <= {"apiGroups", "resources", "verbs", "resourceNames"}, f"unexpected rule fields: {raw}"
        return cls(
            frozenset(raw.get("apiGroups", [])),
            frozenset(raw.get("resources", [])),
            frozenset(raw["verbs"]),
            frozenset(raw.get("resourceNames", [])),
        )


def rule(group: str, resources: list[str], verbs: list[str], names: list[str] | None = None) -> Rule:
    return Rule(frozenset([group]), frozenset(resources), frozenset(verbs), frozenset(names or []))


@dataclass(frozen=True)
class Grant:
    """One effective permission: (namespace or "*" for cluster-wide, group, resource, verb, name)."""

    namespace: str
    group: str
    resource: str
    verb: str
    name: str


def values(warm: bool, profiles: bool) -> dict[str, object]:
    return {
        "warmPooling.enabled": warm,
        "warmPooling.profiles.enabled": profiles,
        "sandbox.namespace": SANDBOX_NAMESPACE,
    }


def roles(manifests: Manifests) -> dict[tuple[str, str, str], frozenset[Rule]]:
    """(kind, namespace, name) → rules, for every Role and ClusterRole."""
    found: dict[tuple[str, str, str], frozenset[Rule]] = {}
    for kind in ("Role", "ClusterRole"):
        for obj in manifests.of_kind(kind):
            meta = obj["metadata"]
            rules = [Rule.parse(raw) for raw in obj.get("rules") or []]
            assert len(rules) == len(set(rules)), f"duplicate rules in {meta['name']}"
            found[(kind, meta.get("namespace", ""), meta["name"])] = frozenset(rules)
    return found


def grants(manifests: Manifests) -> set[Grant]:
    """Every permission the gateway's ServiceAccount ends up with (through its bindings)."""
    by_ref = roles(manifests)
    result: set[Grant] = set()
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for binding in manifests.of_kind(kind):
            subjects = binding["subjects"]
            assert subjects == [{"kind": "ServiceAccount", "name": GATEWAY_SA, "namespace": RELEASE_NAMESPACE}]
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace", "")
            role_key = (ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])
            assert role_key in by_ref, f"{binding['metadata']['name']} refers to a missing {role_key}"
            scope = namespace if kind == "RoleBinding" else "*"
            for r in by_ref[role_key]:
                for group in r.groups:
                    for resource in r.resources:
                        for verb in r.verbs:
                            for name in r.names or {""}:
                                result.add(Grant(scope, group, resource, verb, name))
    return result


def expected_roles(warm: bool, profiles: bool) -> dict[tuple[str, str, str], frozenset[Rule]]:
    reconciler = warm and profiles  # profiles are a sub-feature of warm pooling
    expected = {
        ("Role", SANDBOX_NAMESPACE, f"{FULLNAME}-sandboxes"): frozenset(
            {
                rule("agents.x-k8s.io", ["sandboxes"], ["get", "list", "watch", "create", "delete", "patch"]),
                rule("", ["pods"], ["get", "list", "watch"]),
                rule("", ["events"], ["list", "watch"]),
            }
        ),
        ("Role", RELEASE_NAMESPACE, f"{FULLNAME}-leader-election"): frozenset(
            {rule("coordination.k8s.io", ["leases"], ["get", "update"], [LEASE])}
            | ({rule("coordination.k8s.io", ["leases"], ["create"])} if reconciler else set())
        ),
        ("ClusterRole", "", f"{RELEASE_NAMESPACE}-{FULLNAME}-tokenreview"): frozenset(
            {rule("authentication.k8s.io", ["tokenreviews"], ["create"])}
        ),
    }
    if warm:
        expected[("Role", SANDBOX_NAMESPACE, f"{FULLNAME}-warm-pools")] = frozenset(
            {
                rule(EXTENSIONS, ["sandboxclaims"], ["get", "list", "watch", "create", "delete"]),
                rule(EXTENSIONS, ["sandboxtemplates", "sandboxwarmpools"], ["get", "list", "watch"]),
            }
        )
    if reconciler:
        expected[("Role", SANDBOX_NAMESPACE, f"{FULLNAME}-profiles")] = frozenset(
            {
                rule(EXTENSIONS, ["sandboxtemplates", "sandboxwarmpools"], ["create", "patch", "delete"]),
                rule("", ["configmaps"], ["get", "list", "watch", "patch"]),
            }
        )
    return expected


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_exact_roles_per_toggle_combination(warm: bool, profiles: bool) -> None:
    assert roles(render(values(warm, profiles))) == expected_roles(warm, profiles)


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_every_role_is_bound_to_the_gateway_only(warm: bool, profiles: bool) -> None:
    manifests = render(values(warm, profiles))
    bound = {
        (b["roleRef"]["kind"], b["metadata"].get("namespace", ""), b["roleRef"]["name"])
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in manifests.of_kind(kind)
    }
    assert bound == set(roles(manifests))
    assert grants(manifests)  # also checks each binding's subject and target


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_claims_are_granted_iff_warm_pooling(warm: bool, profiles: bool) -> None:
    claim_verbs = {g.verb for g in grants(render(values(warm, profiles))) if g.resource == "sandboxclaims"}
    assert claim_verbs == ({"get", "list", "watch", "create", "delete"} if warm else set())


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_template_and_pool_access_follows_the_toggles(warm: bool, profiles: bool) -> None:
    found = grants(render(values(warm, profiles)))
    for resource in ("sandboxtemplates", "sandboxwarmpools"):
        verbs = {g.verb for g in found if g.resource == resource}
        reads = {"get", "list", "watch"} if warm else set()
        writes = {"create", "patch", "delete"} if warm and profiles else set()
        assert verbs == reads | writes
        assert {g.namespace for g in found if g.resource == resource} <= {SANDBOX_NAMESPACE}


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_configmaps_only_for_the_reconciler_and_only_namespaced(warm: bool, profiles: bool) -> None:
    found = {g for g in grants(render(values(warm, profiles))) if g.resource == "configmaps"}
    if warm and profiles:
        assert found == {Grant(SANDBOX_NAMESPACE, "", "configmaps", v, "") for v in ("get", "list", "watch", "patch")}
    else:
        assert found == set()


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_cluster_wide_only_tokenreview_create(warm: bool, profiles: bool) -> None:
    cluster_wide = {g for g in grants(render(values(warm, profiles))) if g.namespace == "*"}
    assert cluster_wide == {Grant("*", "authentication.k8s.io", "tokenreviews", "create", "")}


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_never_writes_pods_nor_reads_secrets_nor_wildcards(warm: bool, profiles: bool) -> None:
    found = grants(render(values(warm, profiles)))
    pod_verbs = {g.verb for g in found if g.resource.startswith("pods")}
    assert pod_verbs == {"get", "list", "watch"}, "the sandbox-id annotation must stay immutable: no pod writes"
    assert not [g for g in found if g.resource == "secrets"]
    assert not [g for g in found if "*" in (g.group, g.resource, g.verb)]
    assert not [g for g in found if "/" in g.resource], "no subresources (pods/exec, */status, ...) are granted"


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_lease_update_only_on_its_own_lease(warm: bool, profiles: bool) -> None:
    leases = {g for g in grants(render(values(warm, profiles))) if g.resource == "leases"}
    named = {Grant(RELEASE_NAMESPACE, "coordination.k8s.io", "leases", v, LEASE) for v in ("get", "update")}
    # create cannot carry resourceNames (no name at authorization time): granted only when the
    # reconciler, the work that needs the lease, runs.
    create = {Grant(RELEASE_NAMESPACE, "coordination.k8s.io", "leases", "create", "")}
    assert leases == (named | create if warm and profiles else named)


@pytest.mark.parametrize(("warm", "profiles"), TOGGLES)
def test_the_lease_the_rbac_names_is_the_one_the_chart_creates(warm: bool, profiles: bool) -> None:
    lease = render(values(warm, profiles)).one("Lease")
    assert (lease["metadata"]["name"], lease["metadata"]["namespace"]) == (LEASE, RELEASE_NAMESPACE)
    assert lease["spec"] == {}, "holder and timings belong to the elector, never to Helm"


def test_sandbox_namespace_defaults_to_the_release_namespace() -> None:
    manifests = render({"warmPooling.profiles.enabled": True})
    namespaces = {obj["metadata"]["namespace"] for obj in manifests.of_kind("Role")}
    assert namespaces == {RELEASE_NAMESPACE}


def test_rbac_create_false_renders_no_rbac() -> None:
    manifests = render({"rbac.create": False, "warmPooling.profiles.enabled": True})
    kinds = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert not [obj for obj in manifests.objects if obj["kind"] in kinds]


def test_sandbox_service_account_is_granted_nothing() -> None:
    manifests = render(values(True, True))
    subjects = [
        s for kind in ("RoleBinding", "ClusterRoleBinding") for b in manifests.of_kind(kind) for s in b["subjects"]
    ]
    assert {s["name"] for s in subjects} == {GATEWAY_SA}
